"""Worker threads for fsyncs that report back straight into the trio thread.

``trio.to_thread.run_sync`` wakes the task that waits for it, and that task then wakes the
tasks waiting for the appends: each hand-off is a scheduler round on the path of every
acknowledgement. A :class:`Syncer` runs a job on one of its threads and calls the job's
completion callback in the trio thread itself (``TrioToken.run_sync_soon``), so whatever
was waiting for the fsync (visibility, ACKs, produce responses) happens in that callback,
the moment the fsync returns.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

import structlog
import trio

log = structlog.get_logger("gateway.store")

#: ``on_done(error, seconds)``: the job's OSError (None when it succeeded) and its duration.
Done = Callable[[OSError | None, float], None]

_STOP: Final = None


class Job(Protocol):
    def run(self) -> None:
        """Blocking work (fdatasync); raises OSError on failure."""


class Syncer:
    """Up to ``max_threads`` worker threads, started as jobs need them.

    Create it in the trio thread (it keeps that run's token). Threads are daemons; call
    :meth:`close` when done with it (jobs still queued are then never run nor reported).
    """

    def __init__(self, max_threads: int) -> None:
        if max_threads <= 0:
            raise ValueError("a Syncer needs at least one thread")
        self._token = trio.lowlevel.current_trio_token()
        self._max_threads = max_threads
        self._jobs: queue.SimpleQueue[tuple[Job, Done] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def threads(self) -> int:
        """Worker threads started so far."""
        return len(self._threads)

    def submit(self, job: Job, on_done: Done) -> None:
        """Run ``job`` on a worker thread; ``on_done`` is then called in the trio thread."""
        if self._closed:
            raise RuntimeError("the syncer is closed")
        with self._lock:
            # _idle: idle threads minus queued jobs no thread has taken yet.
            start = self._idle <= 0 and len(self._threads) < self._max_threads
            if not start:
                self._idle -= 1
        if start:
            thread = threading.Thread(target=self._work, name="figtank-fsync", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._jobs.put((job, on_done))

    def close(self) -> None:
        """Stop the threads once the jobs before this call are done."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(_STOP)

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            job, on_done = item
            started = time.perf_counter()
            error: OSError | None = None
            try:
                job.run()
            except OSError as exc:
                error = exc
            except BaseException as exc:  # never lose a job's report to an odd failure
                error = OSError(f"sync job failed: {exc!r}")
            elapsed = time.perf_counter() - started
            with self._lock:
                self._idle += 1
            try:
                self._token.run_sync_soon(on_done, error, elapsed)
            except trio.RunFinishedError:
                log.warning("sync_report_lost", reason="the trio run has finished")
