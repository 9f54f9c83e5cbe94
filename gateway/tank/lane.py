"""The ordered lane of one connection: admin requests that change the log, in arrival order.

A Tank client that sends a CreateTopic (or ReloadConf) and then a Produce expects the
topic to be there. Such requests go through one :class:`OrderedLane` per connection, served
one batch at a time, and Produces that arrive while one is queued or served queue behind it
(consecutive ones form one batch, one backend call). Otherwise a Produce does not wait
here: it is handed to the backend when it is read, which keeps pipelined Produces in order.
Read-only requests (Consume, Status, Discover*) never wait in the lane.

The lane is served by a task of the connection that runs only while the lane has
requests (the session starts it with the first one): most connections never use the lane,
and an idle one holds neither the task nor the queue.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

R = TypeVar("R")


class OrderedLane(Generic[R]):
    """A FIFO of requests, handed out as batches of consecutive batchable ones."""

    __slots__ = ("_items", "_max_batch_bytes", "_serving", "queued_bytes")

    def __init__(self, max_batch_bytes: int) -> None:
        self._items: deque[tuple[R, int, bool]] | None = None  # made with the first
        self._max_batch_bytes = max_batch_bytes
        self._serving = 0
        #: Bytes of requests queued or being served.
        self.queued_bytes = 0

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else 0

    @property
    def busy(self) -> bool:
        """Requests are queued or being served (a request that must follow them in order
        has to queue too)."""
        return bool(self._items) or self._serving > 0

    def put_nowait(self, request: R, size: int, *, batchable: bool) -> None:
        """Queue ``request`` (``size`` bytes); ``batchable`` ones may share a batch."""
        if self._items is None:
            self._items = deque()
        self._items.append((request, size, batchable))
        self.queued_bytes += size

    def next_batch(self) -> tuple[list[R], int] | None:
        """The next batch and its size: consecutive batchable requests (at least one, up to
        ``max_batch_bytes``), or one other request; None when the lane is empty (its queue
        is given back). Call :meth:`done` with the size after."""
        items = self._items
        if not items:
            self._items = None
            return None
        request, size, batchable = items.popleft()
        self._serving += 1
        batch = [request]
        if batchable:
            while items and items[0][2] and size + items[0][1] <= self._max_batch_bytes:
                more, more_size, _ = items.popleft()
                batch.append(more)
                size += more_size
        return batch, size

    def done(self, size: int) -> None:
        """A batch of ``size`` bytes has been served."""
        self.queued_bytes -= size
        self._serving -= 1
