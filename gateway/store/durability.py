"""Group commit: one fsync, run in a worker thread, covers every append waiting at that moment.

Each partition owns a :class:`GroupCommit`. An append writes its bundle (to the page
cache, in the event loop) and queues a :class:`Ticket`. When no sync is running one starts
at once: the partition says what to sync, a :class:`~gateway.store.syncer.Syncer` thread
runs ``fdatasync`` (the event loop keeps serving), and when it returns every ticket queued
before it started is resolved in the trio thread, the partition publishes them and the
tickets' callbacks run. Appends that arrive during a sync are covered by the next one. One
partition's sync never waits for another's.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Final, Generic, TypeVar

import structlog
import trio

from gateway.store.syncer import NativeSyncer, Syncer

log = structlog.get_logger("gateway.store")


class Durability(StrEnum):
    """When an append is acknowledged."""

    #: After its bundle is fsynced (group commit). The default.
    FSYNC = "fsync"
    #: After ``write()`` (page cache), like the Tank broker.
    OS = "os"


_PENDING: Final = 0
_DONE: Final = 1
_FAILED: Final = 2


#: What a ticket carries for its group commit's callbacks (the partition's: a Written).
P = TypeVar("P")


class Ticket(Generic[P]):
    """One append waiting for its fsync."""

    __slots__ = ("error", "on_resolved", "payload", "state")

    def __init__(self, payload: P, on_resolved: Callable[[Ticket[P]], None] | None = None
                 ) -> None:
        self.payload = payload
        self.on_resolved = on_resolved
        self.state = _PENDING
        self.error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.state == _FAILED


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


class GroupCommit(Generic[P]):
    """Batches the fsyncs of one partition.

    ``prepare()`` is called in the event loop at the start of a round and returns the
    :class:`SyncJob`, which a syncer thread runs. When it returns, the round is finished
    in the trio thread without a task in between: ``on_durable(payloads)`` gets the
    payloads of the tickets the round made durable (or ``on_failure(error, payloads)``
    those of every pending ticket when the sync failed: all of them failed), then each
    resolved ticket's callback runs.

    Up to ``max_rounds`` rounds run at once: appends written while a round is under way
    start the next round at once, instead of waiting for it to finish. An fdatasync
    covers everything written before it began, so a round that finishes resolves every
    ticket queued before it started, even if an earlier round is still running.
    """

    def __init__(self, syncer: Syncer | NativeSyncer, *,
                 prepare: Callable[[], SyncJob],
                 on_durable: Callable[[Sequence[P]], None],
                 on_failure: Callable[[OSError, Sequence[P]], None],
                 observe: Callable[[float], None] | None = None,
                 max_rounds: int = 2) -> None:
        self._syncer = syncer
        self._observe = observe
        self._prepare = prepare
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._max_rounds = max_rounds
        self._pending: deque[Ticket[P]] = deque()
        #: Tickets ever added, and how many of them the newest running round covers.
        self._added = 0
        self._covered = 0
        self._requested = False
        self._running = 0
        #: Bumped by a failed round: rounds started before it prove nothing any more.
        self._generation = 0
        self._round_done = trio.Event()
        self.rounds = 0

    @property
    def pending(self) -> int:
        """Appends waiting for a sync."""
        return len(self._pending)

    def add(self, payload: P, on_resolved: Callable[[Ticket[P]], None] | None = None
            ) -> Ticket[P]:
        """Queue an append that was just written; call :meth:`start` once the appends
        written together are all added, so that one round covers them.

        ``on_resolved(ticket)`` is called in the trio thread once the ticket is durable or
        failed (check ``ticket.error``).
        """
        ticket = Ticket(payload, on_resolved)
        self._pending.append(ticket)
        self._added += 1
        return ticket

    def request(self) -> None:
        """Ask for a sync round even with no ticket (rolls, ``flush.*``, shutdown)."""
        self._requested = True
        self.start()

    def start(self) -> None:
        """Start a round for the appends no running round covers (when fewer than
        ``max_rounds`` run; else the next round to start covers them)."""
        if self._running >= self._max_rounds:
            return
        if self._added == self._covered and not self._requested:
            return
        self._running += 1
        self._requested = False
        self._covered = mark = self._added
        try:
            job = self._prepare()
        except OSError as exc:
            self._finish(mark, self._generation, None, exc, 0.0)
            return
        self._syncer.submit(job, partial(self._finish, mark, self._generation, job))

    async def drain(self) -> None:
        """Wait until no ticket is pending and no round is running."""
        while self._pending or self._running:
            self.start()
            await self._round_done.wait()

    def _finish(self, mark: int, generation: int, job: SyncJob | None,
                error: OSError | None, seconds: float) -> None:
        """The end of a round, in the trio thread (a callback from the syncer: it must not
        raise). ``mark`` is how many tickets had been added when the round started.

        The tickets' callbacks (the acknowledgements) run before the bookkeeping that
        does not decide them: closing the job's descriptors, the duration metric."""
        observe = error is None and generation == self._generation and self._observe
        self._running -= 1
        self.rounds += 1
        done: list[Ticket[P]] = []
        if error is not None:
            # Everything not yet durable failed: after a failed fsync, a later one may
            # succeed without the lost pages, so the rounds still running prove nothing.
            self._generation += 1
            done = list(self._pending)
            self._pending.clear()
            self._covered = self._added
            for ticket in done:
                ticket.state = _FAILED
                ticket.error = error
            _guarded(self._on_failure, error, [t.payload for t in done])
        elif generation == self._generation:
            first_pending = self._added - len(self._pending)
            while self._pending and first_pending < mark:
                done.append(self._pending.popleft())
                first_pending += 1
            for ticket in done:
                ticket.state = _DONE
            if done:
                _guarded(self._on_durable, [t.payload for t in done])
        for ticket in done:
            # Called once, then dropped: the callback usually holds the tickets (a cycle
            # that would keep the appender, a connection, until the cycle collector runs).
            on_resolved, ticket.on_resolved = ticket.on_resolved, None
            if on_resolved is not None:
                _guarded(on_resolved, ticket)
        if job is not None:
            job.close()
        if observe:
            observe(seconds)
        done_event, self._round_done = self._round_done, trio.Event()
        done_event.set()
        self.start()


def _guarded(fn: Callable[..., None], *args: object) -> None:
    """Call ``fn``; log what it raises (a callback must never break the round)."""
    try:
        fn(*args)
    except Exception:
        log.exception("sync_callback_failed", callback=getattr(fn, "__qualname__", repr(fn)))
