"""Spreading a scenario's load over worker processes, and how busy they were.

Every scenario's ``work`` runs once per worker with a :class:`Share` telling it which part
of the load is its own. With one worker it runs in this process; with more, each runs in
a process of its own (``python -m gateway.bench.worker``) and the workers meet at a
barrier before the timed phase, so their clocks (``time.monotonic``: one clock for the
whole machine) measure the same interval. A worker returns a :class:`WorkerResult`; the
parent merges them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any

import trio

#: How long a worker waits at a barrier for the others.
BARRIER_TIMEOUT = 120.0


def cpu_seconds() -> float:
    """CPU time (user + system) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time another process has used (Linux ``/proc``); None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Fields after the command name: state is the 1st, utime the 12th, stime the 13th.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class WorkerResult:
    """What one worker measured; times are ``time.monotonic()`` seconds."""

    index: int
    start: float
    end: float
    #: CPU seconds the worker used between ``start`` and ``end``.
    cpu: float
    counts: dict[str, int] = field(default_factory=dict)
    #: Latency samples in seconds, by kind.
    samples: dict[str, list[float]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    #: The server's CPU seconds at ``start`` and ``end`` (when its pid is known).
    server_cpu: tuple[float, float] | None = None


class WorkerFailed(RuntimeError):
    """A worker process raised or died; the message holds its traceback."""


class Share:
    """One worker's part of the load, and its clock.

    ``await start()`` marks the beginning of the timed phase (after every worker got
    there); ``finish(...)`` marks its end and builds the :class:`WorkerResult`.
    """

    def __init__(self, index: int = 0, count: int = 1, barrier: PipeBarrier | None = None,
                 server_pid: int | None = None) -> None:
        self.index = index
        self.count = count
        self._barrier = barrier
        self._server_pid = server_pid
        self._start = time.monotonic()
        self._cpu = cpu_seconds()
        self._server_start: float | None = None

    def part(self, total: int) -> tuple[int, int]:
        """``(first, n)``: this worker's slice of ``total`` items split evenly."""
        base, extra = divmod(total, self.count)
        first = self.index * base + min(self.index, extra)
        return first, base + (1 if self.index < extra else 0)

    def mine(self, total: int) -> list[int]:
        """Which of ``range(total)`` (publishers, subscribers) this worker runs."""
        return list(range(self.index, total, self.count))

    async def sync(self) -> None:
        """Wait until every worker gets here."""
        if self._barrier is not None:
            await trio.to_thread.run_sync(self._barrier.wait, BARRIER_TIMEOUT)

    async def start(self) -> None:
        """Meet the other workers, then start the clock of the timed phase."""
        await self.sync()
        self._start = time.monotonic()
        self._cpu = cpu_seconds()
        if self._server_pid is not None:
            self._server_start = process_cpu_seconds(self._server_pid)

    def finish(self, counts: dict[str, int] | None = None,
               samples: dict[str, list[float]] | None = None, *, end: float | None = None,
               **info: object) -> WorkerResult:
        """The result: the clock stops now (or at ``end``, a ``time.monotonic()``)."""
        now = time.monotonic()
        server_cpu = None
        if self._server_pid is not None and self._server_start is not None:
            server_end = process_cpu_seconds(self._server_pid)
            if server_end is not None:
                server_cpu = (self._server_start, server_end)
        return WorkerResult(self.index, self._start, now if end is None else end,
                            cpu_seconds() - self._cpu, counts or {}, samples or {}, info,
                            server_cpu)


def run_workers(scenario: str, work: Callable[[dict[str, Any], Share], Awaitable[WorkerResult]],
                params: dict[str, Any], procs: int, timeout: float) -> list[WorkerResult]:
    """Run ``work``, the work of the scenario called ``scenario``, in ``procs`` workers
    (1: in this process); their results.

    Workers are ``python -m gateway.bench.worker`` processes (they find the work by the
    scenario's name): the parent sends each its part as a pickle on stdin, answers every
    "ready" once all workers sent one (the barrier), and reads the pickled result from
    stdout.
    """
    if procs <= 1:
        return [trio.run(work, params, Share(0, 1, None, params.get("server_pid")))]
    workers = [subprocess.Popen([sys.executable, "-m", "gateway.bench.worker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
               for _ in range(procs)]
    try:
        events: queue.Queue[tuple[int, tuple[Any, ...]]] = queue.Queue()
        for index, worker in enumerate(workers):
            assert worker.stdin is not None
            pickle.dump((scenario, params, index, procs), worker.stdin)
            worker.stdin.flush()
            threading.Thread(target=_read_events, args=(index, worker.stdout, events),
                             daemon=True).start()
        return _collect(workers, events, timeout)
    finally:
        for worker in workers:
            _close(worker)


def _read_events(index: int, stream: IO[bytes], events: queue.Queue[tuple[int, Any]]
                 ) -> None:
    try:
        while True:
            events.put((index, pickle.load(stream)))
    except EOFError:
        events.put((index, ("eof", "")))
    except Exception as exc:  # a garbled stream: say what was wrong with it
        events.put((index, ("eof", f" (bad event stream: {exc!r})")))


def _close(worker: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        assert worker.stdin is not None
        worker.stdin.close()
    try:
        worker.wait(timeout=5)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _collect(workers: list[subprocess.Popen[bytes]], events: queue.Queue[tuple[int, Any]],
             timeout: float
             ) -> list[WorkerResult]:
    deadline = time.monotonic() + timeout
    results: dict[int, WorkerResult] = {}
    ready: set[int] = set()
    while len(results) < len(workers):
        try:
            index, event = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise WorkerFailed(f"the workers did not finish within {timeout:g} s") from None
        kind = event[0]
        if kind == "ready":
            ready.add(index)
            if len(ready) == len(workers):
                for worker in workers:
                    assert worker.stdin is not None
                    worker.stdin.write(b"g")
                    worker.stdin.flush()
                ready.clear()
        elif kind == "result":
            results[index] = event[1]
        elif kind == "error":
            raise WorkerFailed(f"worker {index} failed:\n{event[1]}")
        elif index not in results:  # the end of a stream before its result
            code = workers[index].wait()
            raise WorkerFailed(f"worker {index} exited with code {code} before "
                               f"reporting{event[1]}")
    return [results[i] for i in range(len(workers))]


class PipeBarrier:
    """The worker's side of the barrier: say "ready" on ``out``, wait for "go" on ``into``."""

    def __init__(self, into: IO[bytes], out: IO[bytes]) -> None:
        self._in = into
        self._out = out

    def wait(self, timeout: float | None = None) -> None:
        send_event(self._out, ("ready",))
        if self._in.read(1) != b"g":
            raise RuntimeError("the parent ended the run")


def send_event(out: IO[bytes], event: tuple[Any, ...]) -> None:
    """Write one event to the parent."""
    pickle.dump(event, out)
    out.flush()


def generator_load(results: list[WorkerResult]) -> dict[str, float]:
    """How busy the load generator was: CPU seconds over the wall time of the run."""
    start = min(r.start for r in results)
    end = max(r.end for r in results)
    wall = max(end - start, 1e-9)
    cpu = sum(r.cpu for r in results)
    busiest = max(r.cpu / max(r.end - r.start, 1e-9) for r in results)
    return {"procs": len(results), "cpu_s": cpu, "wall_s": wall, "busy_cores": cpu / wall,
            "busiest_proc": busiest}


def server_load(results: list[WorkerResult]) -> dict[str, float] | None:
    """The server's CPU over the run (from the worker that started first and the one
    that ended last), or None when it was not measured."""
    measured = [r for r in results if r.server_cpu is not None]
    if not measured:
        return None
    first = min(measured, key=lambda r: r.start)
    last = max(measured, key=lambda r: r.end)
    assert first.server_cpu is not None and last.server_cpu is not None
    wall = max(last.end - first.start, 1e-9)
    cpu = last.server_cpu[1] - first.server_cpu[0]
    return {"cpu_s": cpu, "wall_s": wall, "busy_cores": cpu / wall}
