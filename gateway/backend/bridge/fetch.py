"""Fetch through the upstream: one Consume per fetch, identical fetches in flight shared.

A fetch becomes one upstream Consume carrying all its partitions with the caller's
``max_wait`` and ``min_bytes``, so the upstream does the long poll. Fetches with the same
partitions, sequences, fetch sizes and ``min_bytes`` that are in flight together share one
upstream request: Figg subscribers at the same position of a partition (the live tail,
typically) cost one upstream long poll between them, whatever their number.

A caller joins a request only if that request gives up no later than the caller would;
when the shared answer is "nothing arrived" and the caller's own wait is not over, it asks
again with the time it has left. The shared request runs in the backend's nursery, not in
any caller, and is cancelled once every caller has left.

While the upstream is away a fetch waits for it, within its ``max_wait``; if it does not
come back in time every partition answers FAULT.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Final, TypeAlias

import structlog
import trio

from gateway.backend.bridge.upstream import Upstream
from gateway.client.tank import TankClient
from gateway.core.contract import BytesChunk, FetchOutcome, FetchStatus, UpstreamUnavailable
from protocols.tank.messages import ConsumePartitionResult
from protocols.tank.types import ConsumeFlags
from protocols.wire import UINT64_MAX

log = structlog.get_logger("figtank.bridge")

#: ``(topic, partition, seq, fetch_size)``: one partition of an upstream Consume.
Entry: TypeAlias = tuple[str, int, int, int]
_Key: TypeAlias = tuple[tuple[Entry, ...], int]

#: A wait shorter than this is over (clock granularity, rounding to milliseconds).
_EPSILON: Final = 0.001


class _SharedFetch:
    __slots__ = ("deadline", "done", "key", "result", "scope", "waiters")

    def __init__(self, key: _Key, deadline: float) -> None:
        self.key = key
        self.deadline = deadline
        self.waiters = 0
        self.done = trio.Event()
        self.scope = trio.CancelScope()
        #: The outcomes, and whether they only say that the wait ran out.
        self.result: tuple[list[FetchOutcome], bool] | None = None


class FetchForwarder:
    """Serves fetches from the upstream; see the module doc."""

    def __init__(self, upstream: Upstream, nursery: trio.Nursery) -> None:
        self._upstream = upstream
        self._nursery = nursery
        self._in_flight: dict[_Key, _SharedFetch] = {}
        #: Upstream Consume requests started, and fetches that joined one in flight.
        self.requests = 0
        self.joined = 0

    async def fetch(self, entries: Sequence[Entry], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        """The outcome of each entry, in order (each caller gets its own objects)."""
        key = (tuple(entries), min_bytes)
        deadline = trio.current_time() + max(max_wait_ms, 0) / 1000
        while True:
            shared = self._in_flight.get(key)
            if shared is None or shared.deadline > deadline:
                shared = _SharedFetch(key, deadline)
                self._in_flight.setdefault(key, shared)
                self.requests += 1
                self._nursery.start_soon(self._run, shared)
            else:
                self.joined += 1
            outcomes, waited_out = await self._wait(shared)
            if waited_out and deadline - trio.current_time() > _EPSILON:
                continue
            return [dataclasses.replace(o) for o in outcomes]

    async def _wait(self, shared: _SharedFetch) -> tuple[list[FetchOutcome], bool]:
        shared.waiters += 1
        try:
            await shared.done.wait()
        finally:
            shared.waiters -= 1
            if shared.waiters == 0 and not shared.done.is_set():
                self._forget(shared)
                shared.scope.cancel()
        if shared.result is None:  # the backend is closing
            return _faults(len(shared.key[0])), False
        return shared.result

    def _forget(self, shared: _SharedFetch) -> None:
        if self._in_flight.get(shared.key) is shared:
            del self._in_flight[shared.key]

    async def _run(self, shared: _SharedFetch) -> None:
        try:
            with shared.scope:
                shared.result = await self._consume(shared.key, shared.deadline)
        except Exception as exc:  # a bug here must fail these fetches, not the gateway
            log.exception("upstream_fetch_crashed", error=repr(exc))
            shared.result = _faults(len(shared.key[0])), False
        finally:
            self._forget(shared)
            shared.done.set()

    async def _consume(self, key: _Key, deadline: float) -> tuple[list[FetchOutcome], bool]:
        entries, min_bytes = key

        async def request(client: TankClient) -> list[ConsumePartitionResult | None]:
            left = max(deadline - trio.current_time(), 0.0)
            wait_ms = min(math.ceil(left * 1000), UINT64_MAX)
            return await client.consume_raw(entries, max_wait_ms=wait_ms, min_bytes=min_bytes)

        try:
            results = await self._upstream.call("consume", deadline, request, long_poll=True)
        except UpstreamUnavailable:
            return _faults(len(entries)), True
        outcomes = [fetch_outcome(r) for r in results]
        waited_out = all(o.status is FetchStatus.DATA and not o.chunk.length for o in outcomes)
        return outcomes, waited_out


def _faults(count: int) -> list[FetchOutcome]:
    return [FetchOutcome(FetchStatus.FAULT) for _ in range(count)]


def fetch_outcome(result: ConsumePartitionResult | None) -> FetchOutcome:
    """A Consume response partition as a :class:`FetchOutcome` (None: unknown topic)."""
    if result is None:
        return FetchOutcome(FetchStatus.UNKNOWN_TOPIC)
    flags = result.flags
    if flags == ConsumeFlags.OK or flags == ConsumeFlags.SPARSE_FIRST_BUNDLE:
        base = result.base_seq_num if flags == ConsumeFlags.OK else None
        if not result.chunk:  # the upstream's base is where the request resolved to
            return FetchOutcome(FetchStatus.DATA, high_water_mark=result.high_water_mark,
                                resolved_seq=base)
        return FetchOutcome(FetchStatus.DATA, high_water_mark=result.high_water_mark,
                            base_seq=base, chunk=BytesChunk(result.chunk))
    if flags == ConsumeFlags.BOUNDARY_CHECK:
        return FetchOutcome(FetchStatus.BOUNDARY, high_water_mark=result.high_water_mark,
                            first_available=result.first_available_seq_num)
    if flags == ConsumeFlags.UNKNOWN_PARTITION:
        return FetchOutcome(FetchStatus.UNKNOWN_PARTITION)
    # System fault, no leader, another leader: this standalone bridge can not serve it.
    return FetchOutcome(FetchStatus.FAULT)
