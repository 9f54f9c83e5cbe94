"""Appends that wait their turn (:class:`AppendQueue`): those made while the partition is
held by another append, and those whose bundle needs a segment roll while earlier appends
still wait for their fsync. A task of the store writes them under the partition's lock,
in call order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from gateway.store.appending import AppendEntry, AppendOutcome, MustWait
from gateway.store.durability import Ticket
from gateway.store.syncing import Written, report_when_durable

#: Writes entries now until one must wait (:class:`MustWait`): outcomes and tickets.
WriteNow = Callable[[Sequence[AppendEntry]],
                    tuple[list[AppendOutcome], list[tuple[int, Ticket[Written]]]]]


class AppendQueue:
    """The appends of a partition finished in tasks.

    ``lock`` is the partition's (held while a task writes); ``write_now`` writes entries
    until one must wait; ``drain`` waits for the pending fsyncs; ``spawn`` starts a task.
    """

    def __init__(self, lock: trio.Lock, write_now: WriteNow,
                 drain: Callable[[], Awaitable[None]], spawn: Callable[..., Any]) -> None:
        self._lock = lock
        self._write_now = write_now
        self._drain = drain
        self._spawn = spawn
        #: Tasks spawned and not yet holding the lock: appends made meanwhile queue too.
        self.waiting = 0

    def later(self, entries: Sequence[AppendEntry],
              on_done: Callable[[list[AppendOutcome]], None],
              written: list[AppendOutcome] | None = None,
              tickets: list[tuple[int, Ticket[Written]]] | None = None) -> None:
        """Finish an append in a task: the entries after ``written`` (with ``tickets``
        for those still waiting for their fsync) wait for the lock; ``on_done`` gets
        every outcome once each is durable or failed."""
        self.waiting += 1
        self._spawn(self._append_in_task, entries, on_done, written or [], tickets or [])

    async def _append_in_task(self, entries: Sequence[AppendEntry],
                              on_done: Callable[[list[AppendOutcome]], None],
                              outcomes: list[AppendOutcome],
                              tickets: list[tuple[int, Ticket[Written]]]) -> None:
        async with self._lock:
            self.waiting -= 1
            rest, rest_tickets = await self.write_all(entries[len(outcomes):])
        tickets = tickets + [(i + len(outcomes), t) for i, t in rest_tickets]
        report_when_durable(outcomes + rest, tickets, on_done)

    async def write_all(self, entries: Sequence[AppendEntry]
                        ) -> tuple[list[AppendOutcome], list[tuple[int, Ticket[Written]]]]:
        """Write every entry (the caller holds the lock), draining the pending fsyncs
        first where a segment must roll."""
        outcomes: list[AppendOutcome] = []
        tickets: list[tuple[int, Ticket[Written]]] = []
        while True:
            try:
                done, more = self._write_now(entries[len(outcomes):])
            except MustWait as wait:
                done, more = wait.outcomes, wait.tickets
                await self._drain()
            tickets += [(i + len(outcomes), t) for i, t in more]
            outcomes += done
            if len(outcomes) == len(entries):
                return outcomes, tickets
