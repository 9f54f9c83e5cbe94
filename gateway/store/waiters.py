"""The readers waiting for a partition's next visible append (:class:`Waiters`)."""

from __future__ import annotations

from collections.abc import Callable

import trio
from trio.lowlevel import ParkingLot


class Waiters:
    """Who waits for a partition's next visible append: tasks parked in one lot (woken
    together), and events (one event can wait on many partitions, with no task per
    partition). An idle waiter costs nothing but its parked task or its event.

    ``lot`` and ``events`` are never replaced, so the partition's one-call append can
    wake them inline (``lot.unpark_all()``; :meth:`set_events` only when ``events``).
    """

    __slots__ = ("events", "lot")

    def __init__(self) -> None:
        self.lot = ParkingLot()
        self.events: set[trio.Event] = set()

    def notify(self) -> None:
        """Wake every parked task and set every event (each event once)."""
        self.lot.unpark_all()
        if self.events:
            self.set_events()

    def set_events(self) -> None:
        """Set and forget every event added."""
        events = list(self.events)
        self.events.clear()
        for event in events:
            event.set()

    async def wait_until(self, reached: Callable[[], bool], deadline: float) -> None:
        """Park until ``reached()`` holds after a wake-up, or the trio clock reaches
        ``deadline``."""
        with trio.move_on_at(deadline):
            while not reached():
                await self.lot.park()

    async def park(self) -> None:
        """Park until the next wake-up."""
        await self.lot.park()

    def add(self, event: trio.Event) -> None:
        """Set ``event`` at the next wake-up."""
        self.events.add(event)

    def remove(self, event: trio.Event) -> None:
        """Forget ``event`` (after a wait that ended otherwise)."""
        self.events.discard(event)
