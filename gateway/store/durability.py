"""Group commit: one fsync, run in a worker thread, covers every append waiting at that moment.

Each partition owns a :class:`GroupCommit`. An append writes its bundle (to the page
cache, in the event loop), queues a :class:`Ticket` and waits. When no sync is running
a background task starts one: it asks the partition what to sync, runs ``fdatasync``
in a worker thread (the event loop keeps serving), then resolves every ticket that was
queued before it started and lets the partition publish them. Appends that arrive
during a sync are covered by the next one. One partition's sync never waits for
another's.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import trio

from gateway.store.errors import StoreClosed, StoreIOError


class Durability(StrEnum):
    """When an append is acknowledged."""

    #: After its bundle is fsynced (group commit). The default.
    FSYNC = "fsync"
    #: After ``write()`` (page cache), like the Tank broker.
    OS = "os"


_PENDING: Final = 0
_DONE: Final = 1
_FAILED: Final = 2


class Ticket:
    """One append waiting for its fsync."""

    __slots__ = ("error", "payload", "state")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.state = _PENDING
        self.error: BaseException | None = None


@dataclass(slots=True)
class SyncJob:
    """What one sync round flushes: owned (dup'ed) descriptors, and maybe a directory."""

    fds: list[int] = field(default_factory=list)
    directory: str | None = None

    def run(self) -> None:
        """fdatasync every descriptor, fsync the directory; always close what it owns."""
        try:
            for fd in self.fds:
                os.fdatasync(fd)
            if self.directory is not None:
                sync_directory(self.directory)
        finally:
            self.close()

    def close(self) -> None:
        """Close the owned descriptors."""
        fds, self.fds = self.fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def sync_directory(path: str) -> None:
    """fsync a directory, making created/renamed/deleted entries in it durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupCommit:
    """Batches the fsyncs of one partition.

    ``prepare()`` is called in the event loop at the start of a round and
    returns the :class:`SyncJob`; ``on_durable(payloads)`` gets the payloads of the
    tickets the round made durable, ``on_failure(error, payloads)`` those of every
    pending ticket when the sync failed (all of them failed).
    """

    def __init__(self, spawn: Callable[..., Any], limiter: trio.CapacityLimiter, *,
                 prepare: Callable[[], SyncJob],
                 on_durable: Callable[[Sequence[Any]], None],
                 on_failure: Callable[[OSError, Sequence[Any]], None],
                 observe: Callable[[float], None] | None = None) -> None:
        self._spawn = spawn
        self._observe = observe
        self._limiter = limiter
        self._prepare = prepare
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._pending: deque[Ticket] = deque()
        self._requested = False
        self._running = False
        self._round_done = trio.Event()
        self.rounds = 0

    @property
    def pending(self) -> int:
        """Appends waiting for a sync."""
        return len(self._pending)

    def add(self, payload: Any) -> Ticket:
        """Queue an append that was just written and start a sync if none is running."""
        ticket = Ticket(payload)
        self._pending.append(ticket)
        self._start()
        return ticket

    def request(self) -> None:
        """Ask for a sync round even with no ticket (rolls, ``flush.*``, shutdown)."""
        self._requested = True
        self._start()

    def _start(self) -> None:
        if not self._running:
            self._running = True
            self._spawn(self._run)

    async def wait(self, ticket: Ticket) -> None:
        """Return once ``ticket`` is durable; raise :class:`StoreIOError` if its sync failed."""
        while ticket.state == _PENDING:
            await self._round_done.wait()
        if ticket.state == _FAILED:
            raise StoreIOError(f"fsync failed: {ticket.error}") from ticket.error

    async def drain(self) -> None:
        """Wait until no ticket is pending (each resolved durable or failed)."""
        while self._pending:
            self._start()
            await self._round_done.wait()

    def fail_all(self, error: BaseException) -> None:
        """Fail every pending ticket (used when the store closes under them)."""
        while self._pending:
            ticket = self._pending.popleft()
            ticket.state = _FAILED
            ticket.error = error
        self._signal()

    def _signal(self) -> None:
        done, self._round_done = self._round_done, trio.Event()
        done.set()

    async def _run(self) -> None:
        try:
            while self._pending or self._requested:
                self._requested = False
                count = len(self._pending)
                job: SyncJob | None = None
                try:
                    job = self._prepare()
                    started = time.perf_counter()
                    await trio.to_thread.run_sync(job.run, limiter=self._limiter)
                    if self._observe is not None:
                        self._observe(time.perf_counter() - started)
                except OSError as exc:
                    failed = list(self._pending)
                    self._pending.clear()
                    for ticket in failed:
                        ticket.state = _FAILED
                        ticket.error = exc
                    self._on_failure(exc, [t.payload for t in failed])
                else:
                    done = [self._pending.popleft() for _ in range(count)]
                    for ticket in done:
                        ticket.state = _DONE
                    self._on_durable([t.payload for t in done])
                finally:
                    if job is not None:
                        job.close()
                    self.rounds += 1
                    self._signal()
        finally:
            self._running = False
            if self._pending:
                # Cancelled (the store is closing): nobody will sync these any more.
                self.fail_all(StoreClosed("store closed before the append was synced"))
