"""Worker threads for fsyncs that report back straight into the trio thread.

``trio.to_thread.run_sync`` wakes the task that waits for it, and that task then wakes the
tasks waiting for the appends: each hand-off is a scheduler round on the path of every
acknowledgement. A syncer runs a job on one of its threads and calls the job's completion
callback in the trio thread itself, so whatever was waiting for the fsync (visibility,
ACKs, produce responses) happens in that callback, the moment the fsync returns.

Two implementations with one interface (``submit``, ``run``, ``close``):

- :class:`NativeSyncer` (when the compiled ``gateway.store._fsync`` is built): workers in C
  that never take the GIL, fed and answered through pipes the event loop watches. A Python
  worker needs the GIL to pick up each job and again after each ``fdatasync``, so its
  rounds wait for the event loop's thread to let go of the GIL;
- :class:`Syncer`, the pure-Python reference: Python threads reporting with
  ``TrioToken.run_sync_soon``.

:func:`open_syncer` picks one.
"""

from __future__ import annotations

import errno
import itertools
import os
import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

import structlog
import trio

from protocols.native import compiled

log = structlog.get_logger("gateway.store")

#: ``on_done(error, seconds)``: the job's OSError (None when it succeeded) and its duration.
Done = Callable[[OSError | None, float], None]

_STOP: Final = None


class Job(Protocol):
    #: Descriptors to fdatasync (owned by the job).
    fds: list[int]
    #: A directory to fsync as well, or None.
    directory: str | None

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

    async def run(self) -> None:
        """Nothing to watch: reports come through the trio token."""

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


if TYPE_CHECKING:
    from gateway.store import _fsync as _native  # its .pyi; None at run time when not built
else:
    _native = compiled("gateway.store._fsync")
_RESULT: Final = struct.Struct("=QiiQ")
#: Jobs written to the workers' pipe at once (well within a pipe's buffer); more wait here.
_MAX_QUEUED_JOBS: Final = 64


class FsyncModule(Protocol):
    """What :class:`NativeSyncer` uses of ``gateway.store._fsync`` (typed by its .pyi)."""

    MAX_FDS: int
    JOB_SIZE: int
    RESULT_SIZE: int
    FSYNC: int
    CLOSE: int

    def run_worker(self, jobs_fd: int, results_fd: int) -> None: ...


class NativeSyncer:
    """Syncs on C worker threads (``gateway.store._fsync``) that never take the GIL.

    Create it in the trio thread; :meth:`run` (a task of the store) delivers the reports.
    """

    def __init__(self, max_threads: int, module: FsyncModule) -> None:
        if max_threads <= 0:
            raise ValueError("a syncer needs at least one thread")
        self._module = module
        self._job = struct.Struct(f"=Qii{module.MAX_FDS}i{module.MAX_FDS}i")
        assert self._job.size == module.JOB_SIZE and _RESULT.size == module.RESULT_SIZE
        self._jobs_r, self._jobs_w = os.pipe()
        self._results_r, self._results_w = os.pipe()
        os.set_blocking(self._results_r, False)
        self._ids = itertools.count(1)
        #: Jobs with the workers (which close their descriptors): id -> (job, on_done).
        self._running: dict[int, tuple[Job, Done]] = {}
        self._waiting: deque[tuple[Job, Done]] = deque()
        self._closed = False
        self._threads = [threading.Thread(target=module.run_worker,
                                          args=(self._jobs_r, self._results_w),
                                          name="figtank-fsync", daemon=True)
                         for _ in range(max_threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job, on_done: Done) -> None:
        """Have a worker sync ``job``; ``on_done`` is then called in the trio thread."""
        if self._closed:
            raise RuntimeError("the syncer is closed")
        if len(self._running) >= _MAX_QUEUED_JOBS:
            self._waiting.append((job, on_done))
            return
        self._send(job, on_done)

    def _send(self, job: Job, on_done: Done) -> None:
        fds = list(job.fds)
        module = self._module
        flags = [module.CLOSE] * len(fds)
        if job.directory is not None:
            try:
                fds.append(os.open(job.directory, os.O_RDONLY | os.O_DIRECTORY))
            except OSError as exc:
                on_done(exc, 0.0)
                return
            flags.append(module.FSYNC | module.CLOSE)
        if len(fds) > module.MAX_FDS:  # rare: many rolls in one round
            if job.directory is not None:
                os.close(fds[-1])
            self._run_here(job, on_done)
            return
        job_id = next(self._ids)
        pad = module.MAX_FDS - len(fds)
        record = self._job.pack(job_id, len(fds), 0, *flags, *([0] * pad), *fds, *([0] * pad))
        self._running[job_id] = (job, on_done)
        os.write(self._jobs_w, record)  # whole records under PIPE_BUF: never split
        # The worker owns the descriptors now and closes them once the job is done, off
        # the event loop's thread; the job's own close() finds none left.
        job.fds = []

    @staticmethod
    def _run_here(job: Job, on_done: Done) -> None:
        started = time.perf_counter()
        try:
            job.run()
        except OSError as exc:
            on_done(exc, time.perf_counter() - started)
            return
        on_done(None, time.perf_counter() - started)

    async def run(self) -> None:
        """Deliver the workers' reports until cancelled (run it in the store's nursery)."""
        size = _RESULT.size
        while True:
            await trio.lowlevel.wait_readable(self._results_r)
            try:
                data = os.read(self._results_r, size * 256)
            except BlockingIOError:
                continue
            for job_id, code, _, nanoseconds in _RESULT.iter_unpack(data):
                on_done = self._running.pop(job_id)[1]
                on_done(OSError(code, os.strerror(code)) if code else None, nanoseconds / 1e9)
            while self._waiting and len(self._running) < _MAX_QUEUED_JOBS:
                self._send(*self._waiting.popleft())

    def close(self) -> None:
        """Stop the workers (after the jobs already handed to them)."""
        if self._closed:
            return
        self._closed = True
        stop = self._job.pack(0, 0, 0, *([0] * (2 * self._module.MAX_FDS)))
        for _ in self._threads:
            try:
                os.write(self._jobs_w, stop)
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    raise
        for thread in self._threads:
            thread.join(timeout=5)
        for fd in (self._jobs_r, self._jobs_w, self._results_r, self._results_w):
            os.close(fd)


def open_syncer(max_threads: int) -> Syncer | NativeSyncer:
    """The native syncer when it is built (and not disabled), else the Python one."""
    if _native is not None:
        return NativeSyncer(max_threads, _native)
    return Syncer(max_threads)
