"""Appends whose offsets the caller must know, on any backend.

The embedded store and the Kafka upstream report the offsets of what they appended. A Tank
upstream does not: Tank's Produce response is one status byte per partition. For a caller
that must answer with offsets (HTTP produce), :func:`produce_placed` then places each
batch itself, as a compare-and-set on the partition's end: it reads the high-water mark
``H`` and sends the batch with ``base_seq = H + 1`` (ProduceWithSeqnum). The upstream
appends it at ``H + 1`` only if nothing was appended since: it refuses a first sequence
that is not above its high-water mark (Tank code 10, INVALID_SEQUENCE), and the batch is
placed again from the new end. So the offsets returned are the ones the messages got,
whoever else produces to the partition at the same time (other gateways, producers
straight to the broker). Within one process the placements of a partition take turns
(a lock per partition), so they do not race each other.

The price is a DiscoverPartitions round trip per append and a retry per concurrent append
from elsewhere. The limit: a partition that others append to without pause can win every
race; after :data:`ATTEMPTS` lost races the append fails with I/O fault (nothing was
appended; the client sends it again). A partition the upstream can not describe is
appended plainly, without offsets. A look-up the upstream did not answer
(:class:`~gateway.core.contract.BackendUnavailable`) fails its batch with I/O fault,
nothing of it sent.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

import trio

from gateway.core.contract import (
    Backend,
    BackendUnavailable,
    ProduceBatch,
    ProduceCode,
    ProduceOutcome,
    produce_and_wait,
)
from protocols.wire import UINT64_MAX

#: Placements of one batch before it fails (each lost to a concurrent append).
ATTEMPTS: Final = 20

_locks: weakref.WeakKeyDictionary[object, dict[tuple[str, int], trio.Lock]] = (
    weakref.WeakKeyDictionary())


def reports_offsets(backend: Backend) -> bool:
    """Whether ``backend``'s produce outcomes carry the offsets (a Tank upstream's not)."""
    return getattr(backend, "reports_offsets", True)


async def produce_placed(backend: Backend, batches: Sequence[ProduceBatch]
                         ) -> list[ProduceOutcome]:
    """Append ``batches`` (plain bundles); every OK outcome carries its offsets when the
    partition can be described (see the module doc). Outcomes in batch order."""
    if reports_offsets(backend):
        return await produce_and_wait(backend, batches)
    outcomes: list[ProduceOutcome | None] = [None] * len(batches)

    async def place(i: int) -> None:
        try:
            outcomes[i] = await _place(backend, batches[i])
        except BackendUnavailable as exc:  # the look-up failed: nothing was sent
            outcomes[i] = ProduceOutcome(ProduceCode.IO_FAULT, reason=str(exc))

    async with trio.open_nursery() as nursery:  # partitions in parallel
        for i in range(len(batches)):
            nursery.start_soon(place, i)
    return [o if o is not None else ProduceOutcome(ProduceCode.IO_FAULT) for o in outcomes]


async def _place(backend: Backend, batch: ProduceBatch) -> ProduceOutcome:
    locks = _locks.setdefault(backend, {})
    key = (batch.topic, batch.partition)
    lock = locks.get(key)
    if lock is None:
        if len(locks) >= 4096:  # forget idle partitions' locks, never one in use
            for idle in [k for k, held in locks.items() if not held.locked()]:
                del locks[idle]
        lock = locks[key] = trio.Lock()
    async with lock:
        outcome = ProduceOutcome(ProduceCode.INVALID_SEQUENCE)
        for _ in range(ATTEMPTS):
            infos = await backend.discover_partitions(batch.topic)
            if infos is None or batch.partition >= len(infos) or (
                    infos[batch.partition].high_water_mark >= UINT64_MAX - 1):
                [outcome] = await produce_and_wait(backend, [batch])
                return outcome
            base = infos[batch.partition].high_water_mark + 1
            [outcome] = await produce_and_wait(backend, [replace(batch, base_seq=base)])
            if outcome.code is not ProduceCode.INVALID_SEQUENCE:
                return outcome
        return ProduceOutcome(ProduceCode.IO_FAULT, reason=(
            f"lost the place at the end of {batch.topic}/{batch.partition} to concurrent "
            f"appends {ATTEMPTS} times"))
