"""PUBLISH on one Figg connection: one append per partition per read, ACKs in publish order.

The connection's reader turns every complete frame of a read into events in one pass
(:meth:`~protocols.figg.connection.FiggConnection.next_batch`); consecutive PUBLISHes to a
topic arrive as one :class:`~protocols.translate.PublishBatch`, already laid out as a Tank
message set with its ACK frames ready. :class:`Publishing` gathers the batches of a read
into one bundle per partition and hands them to the backend at once
(:meth:`~gateway.core.contract.Backend.produce_nowait`): the embedded store writes
them before the reader looks at the next read, and one group fsync covers every connection's bundles
written meanwhile. When the backend reports the appends durable, the connection's
:class:`AckQueue` sends the ACKs that became sendable, in publish order, as one write. A
failed append fails its PUBLISHes: the connection closes without acknowledging them, and
the client resends them (Figg has no error message; the close's logged reason says why,
``disk full: ...`` when the store could not write). PUBLISHes are counted
(``figtank_requests{protocol="figg",type="publish"}``) by their outcome: ``ok`` once
acknowledged, ``error`` once refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from trio.lowlevel import ParkingLot

from gateway.core.contract import Backend, ProduceBatch, ProduceCode, ProduceOutcome
from gateway.figg.offsets import TankPartition
from gateway.figg.outbox import Outbox
from protocols.tank.bundle import BundleInfo, Codec
from protocols.translate import PublishBatch, plain_bundle_head

#: Message-set bytes per bundle: more publishes to one partition in one read become
#: several bundles (of one append call).
BUNDLE_VALUE_BYTES: Final = 1024 * 1024

_PENDING: Final = 0
_DONE: Final = 1
_FAILED: Final = 2


def _ignore(reason: str) -> None:
    """What a closed queue does with a failure: nothing (the connection is gone)."""


class PublishCall:
    """The PUBLISHes of one read, appended together and acknowledged together."""

    __slots__ = ("acks", "count", "nbytes", "reason", "state")

    def __init__(self, acks: bytes, count: int, nbytes: int) -> None:
        self.acks = acks
        self.count = count
        self.nbytes = nbytes
        self.state = _PENDING
        self.reason = ""


class AckQueue:
    """One connection's publishes in flight, in the order they arrived.

    ACKs leave in that order even when appends finish out of order (a Figg client takes
    ACK(n) as acknowledging everything up to n); a failed call stops the queue (nothing
    after it is acknowledged) and calls ``on_failure`` once. ``on_outcome(acked,
    refused)`` counts PUBLISHes by their outcome (the metrics): those acknowledged, and
    those refused (the failed call's, and every one behind it, never acknowledged).
    """

    __slots__ = ("_below", "_calls", "_inflight", "_limit", "_on_failure", "_on_outcome",
                 "_outbox", "acked", "closed")

    def __init__(self, outbox: Outbox, on_failure: Callable[[str], None],
                 on_outcome: Callable[[int, int], None] | None = None) -> None:
        self._outbox = outbox
        self._on_failure = on_failure
        self._on_outcome = on_outcome
        # Made when first needed: a connection that never publishes holds neither.
        self._calls: deque[PublishCall] | None = None
        self._inflight = 0
        self._below: ParkingLot | None = None
        self._limit = 0
        self.closed = False
        #: PUBLISHes acknowledged so far.
        self.acked = 0

    @property
    def in_flight_bytes(self) -> int:
        """Published bytes waiting for their ACK."""
        return self._inflight

    def track(self, call: PublishCall) -> None:
        """Remember ``call`` (in publish order) before it is handed to the backend."""
        if self._calls is None:
            self._calls = deque()
        self._calls.append(call)
        self._inflight += call.nbytes

    async def wait_below(self, limit: int) -> None:
        """Wait until the bytes in flight are under ``limit``."""
        while self._inflight >= limit and not self.closed:
            self._limit = limit
            if self._below is None:
                self._below = ParkingLot()
            await self._below.park()

    def call_finished(self) -> None:
        """Send the ACKs that became sendable (after an append call got its outcome)."""
        if self.closed:
            return
        calls = self._calls
        if calls is None:
            return
        acks: list[bytes] = []
        released = count = 0
        failed: PublishCall | None = None
        while calls and calls[0].state != _PENDING:
            call = calls.popleft()
            if call.state == _FAILED:
                failed = call
                break
            acks.append(call.acks)
            released += call.nbytes
            count += call.count
        if acks:  # durable before the failure, if any: acknowledged all the same
            self._outbox.put_urgent(acks[0] if len(acks) == 1 else b"".join(acks))
            self.acked += count
            self._inflight -= released
            if self._inflight < self._limit and self._below is not None:
                self._below.unpark_all()
        on_outcome = self._on_outcome
        if failed is not None:
            refused = failed.count + sum(call.count for call in calls)
            on_failure = self._on_failure
            self.close()
            on_failure(failed.reason)
            if on_outcome is not None:
                on_outcome(count, refused)
        elif count and on_outcome is not None:
            on_outcome(count, 0)

    def close(self) -> None:
        """Stop acknowledging (the connection is going away)."""
        self.closed = True
        self._on_failure = _ignore  # the session's method: no cycle left behind
        self._on_outcome = None
        if self._below is not None:
            self._below.unpark_all()


class Publishing:
    """Gathers the :class:`PublishBatch`\\ es of one read and appends them in one call."""

    __slots__ = ("_acks", "_backend", "_batches", "_by_partition")

    def __init__(self, backend: Backend, acks: AckQueue) -> None:
        self._backend = backend
        self._acks = acks
        self._batches: list[PublishBatch] = []
        self._by_partition: dict[TankPartition, list[PublishBatch]] = {}

    def add(self, where: TankPartition, batch: PublishBatch) -> None:
        """Publish ``batch`` to ``where`` with the next :meth:`submit`."""
        self._batches.append(batch)
        group = self._by_partition.get(where)
        if group is None:
            self._by_partition[where] = [batch]
        else:
            group.append(batch)

    def submit(self) -> int:
        """Append everything added since the last call; returns the PUBLISHes submitted."""
        batches = self._batches
        if not batches:
            return 0
        by_partition = self._by_partition
        self._batches, self._by_partition = [], {}
        count = sum(b.count for b in batches)
        call = PublishCall(batches[0].acks if len(batches) == 1 else
                           b"".join(b.acks for b in batches), count,
                           sum(len(b.message_set) for b in batches))
        self._acks.track(call)
        produce = [ProduceBatch(where.topic, where.partition, bundle, info=info)
                   for where, group in by_partition.items()
                   for bundle, info in _bundles(group)]
        self._backend.produce_nowait(produce, lambda outcomes: self._done(call, produce,
                                                                         outcomes))
        return count

    def _done(self, call: PublishCall, batches: list[ProduceBatch],
              outcomes: list[ProduceOutcome]) -> None:
        for batch, outcome in zip(batches, outcomes, strict=True):
            if outcome.code is not ProduceCode.OK:
                call.state = _FAILED
                call.reason = _failure(batch, outcome)
                break
        else:
            call.state = _DONE
        self._acks.call_finished()


def _bundles(group: list[PublishBatch]) -> list[tuple[bytes, BundleInfo]]:
    """One partition's batches as bundles of about :data:`BUNDLE_VALUE_BYTES` (a batch is
    never split), each with the header the store then trusts."""
    out = []
    start = size = 0
    for i, batch in enumerate(group):
        if size and size + len(batch.message_set) > BUNDLE_VALUE_BYTES:
            out.append(_bundle(group[start:i]))
            start, size = i, 0
        size += len(batch.message_set)
    out.append(_bundle(group[start:]))
    return out


def _bundle(batches: list[PublishBatch]) -> tuple[bytes, BundleInfo]:
    count = sum(b.count for b in batches)
    bundle = b"".join([plain_bundle_head(count), *(b.message_set for b in batches)])
    return bundle, BundleInfo(count, Codec.NONE, False, None, None)


def _failure(batch: ProduceBatch, outcome: ProduceOutcome) -> str:
    if outcome.fault:  # the store's reason names the disk: "disk full: ..."
        return f"publish to {batch.topic}/{batch.partition} refused: {outcome.reason}"
    detail = f" ({outcome.reason})" if outcome.reason else ""
    return (f"publish to {batch.topic}/{batch.partition} failed: "
            f"{outcome.code.name.lower()}{detail}")
