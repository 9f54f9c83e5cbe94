"""Group commit for PUBLISH: one bundle per partition per flush, ACKs in publish order.

A connection turns the PUBLISHes of one read into :class:`PublishRun` objects (a run is
consecutive publishes to one partition) and hands them to the shared :class:`Publisher`.
Per partition, one flush is in flight at a time; runs that arrive meanwhile, from any
connection, wait and go out together in the next flush as one bundle
(:meth:`Backend.produce`). When a flush is durable its runs are marked done and each
connection's :class:`AckQueue` writes the ACKs it can now send, in publish order, as one
write. A failed flush fails its runs: their connections close without acknowledging, and
the clients resend (Figg has no error message).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import structlog
import trio
from trio.lowlevel import ParkingLot

from gateway.backend import Backend, ProduceBatch, ProduceCode
from gateway.figg.outbox import Outbox
from gateway.offsets import TankPartition
from protocols.figg.messages import FAST, MessageType
from protocols.tank.bundle import Codec, Message, encode_bundle

log = structlog.get_logger("figtank.figg")

#: Values per bundle: a flush larger than this becomes several bundles (one produce call).
BUNDLE_VALUE_BYTES: Final = 1024 * 1024

_encode_acks = FAST[MessageType.ACK].batch_encoder(shared=0)


class RunState(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class PublishRun:
    """Consecutive PUBLISHes of one connection to one partition, acknowledged together."""

    __slots__ = ("nbytes", "owner", "reason", "seq_nums", "state", "values")

    def __init__(self, owner: AckQueue) -> None:
        self.owner = owner
        self.seq_nums: list[int] = []
        self.values: list[bytes] = []
        self.nbytes = 0
        self.state = RunState.PENDING
        self.reason = ""

    def add(self, seq_num: int, value: bytes) -> None:
        """Append one publish (the session fills the lists directly on its hot path and
        sets ``nbytes`` before submitting)."""
        self.seq_nums.append(seq_num)
        self.values.append(value)
        self.nbytes += len(value)


class AckQueue:
    """One connection's publishes in flight, in the order they arrived.

    ACKs leave in that order even when partitions finish out of order; a failed run stops
    the queue (nothing after it is acknowledged) and calls ``on_failure`` once.
    """

    def __init__(self, outbox: Outbox, on_failure: Callable[[str], None]) -> None:
        self._outbox = outbox
        self._on_failure = on_failure
        self._runs: deque[PublishRun] = deque()
        self._inflight = 0
        self._below = ParkingLot()
        self._limit = 0
        self.closed = False
        #: PUBLISHes acknowledged so far.
        self.acked = 0

    @property
    def inflight_bytes(self) -> int:
        """Value bytes published on this connection and not yet acknowledged."""
        return self._inflight

    def track(self, run: PublishRun) -> None:
        """Remember ``run`` (in publish order) before it is submitted."""
        self._runs.append(run)
        self._inflight += run.nbytes

    async def wait_below(self, limit: int) -> None:
        """Wait until the bytes in flight are under ``limit``."""
        while self._inflight >= limit and not self.closed:
            self._limit = limit
            await self._below.park()

    def run_finished(self) -> None:
        """Send the ACKs that became sendable (called after a flush marks its runs)."""
        if self.closed:
            return
        runs = self._runs
        seq_nums: list[int] = []
        released = 0
        while runs and runs[0].state is not RunState.PENDING:
            run = runs.popleft()
            if run.state is RunState.FAILED:
                self.close()
                self._on_failure(run.reason)
                return
            seq_nums += run.seq_nums
            released += run.nbytes
        if seq_nums:
            self._outbox.put_urgent(_encode_acks((s,) for s in seq_nums))
            self.acked += len(seq_nums)
            self._inflight -= released
            if self._inflight < self._limit:
                self._below.unpark_all()

    def close(self) -> None:
        """Stop acknowledging (the connection is going away)."""
        self.closed = True
        self._below.unpark_all()


class Publisher:
    """Flushes the runs of every connection, one bundle per partition per flush.

    Flush tasks run in ``nursery`` (the listener's), not in a connection's, so a client
    that leaves never cancels a flush that carries other clients' messages. (Counting
    appended messages is the backend's job: it sees every protocol's appends.)
    """

    def __init__(self, backend: Backend, nursery: trio.Nursery) -> None:
        self._backend = backend
        self._nursery = nursery
        self._pending: dict[TankPartition, list[PublishRun]] = {}

    @property
    def idle(self) -> bool:
        """No flush in flight or waiting."""
        return not self._pending

    def submit(self, where: TankPartition, run: PublishRun) -> None:
        """Queue ``run`` for the next flush of ``where``."""
        pending = self._pending.get(where)
        if pending is None:
            pending = self._pending[where] = []
            self._nursery.start_soon(self._flush_loop, where, pending)
        pending.append(run)

    async def _flush_loop(self, where: TankPartition, pending: list[PublishRun]) -> None:
        while pending:
            runs = pending[:]
            pending.clear()
            await self._flush(where, runs)
        # No checkpoint since the check: nothing was submitted in between.
        del self._pending[where]

    async def _flush(self, where: TankPartition, runs: list[PublishRun]) -> None:
        groups = _group(runs)
        ts = int(time.time() * 1000)
        batches = [
            ProduceBatch(where.topic, where.partition, encode_bundle(
                [Message(v, None, ts) for r in group for v in r.values], codec=Codec.NONE))
            for group in groups]
        try:
            outcomes = await self._backend.produce(batches)
        except trio.Cancelled:
            raise
        except Exception as exc:  # a backend fault fails these publishes, not the listener
            log.error("figg_publish_failed", topic=where.topic, partition=where.partition,
                      error=repr(exc))
            outcomes = None
        owners: dict[int, AckQueue] = {}
        for i, group in enumerate(groups):
            outcome = outcomes[i] if outcomes is not None and i < len(outcomes) else None
            ok = outcome is not None and outcome.code is ProduceCode.OK
            reason = "" if ok else _failure(where, outcome)
            for run in group:
                run.state = RunState.DONE if ok else RunState.FAILED
                run.reason = reason
                owners[id(run.owner)] = run.owner
        for owner in owners.values():
            owner.run_finished()


def _group(runs: list[PublishRun]) -> list[list[PublishRun]]:
    """Split runs into bundles of about :data:`BUNDLE_VALUE_BYTES` (a run is never split)."""
    groups: list[list[PublishRun]] = [[]]
    size = 0
    for run in runs:
        if size and size + run.nbytes > BUNDLE_VALUE_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(run)
        size += run.nbytes
    return groups


def _failure(where: TankPartition, outcome: object) -> str:
    target = f"{where.topic}/{where.partition}"
    if outcome is None:
        return f"publish to {target} failed: backend error"
    code = getattr(outcome, "code", None)
    name = code.name.lower() if isinstance(code, ProduceCode) else str(code)
    detail = getattr(outcome, "reason", "")
    return f"publish to {target} failed: {name}" + (f" ({detail})" if detail else "")
