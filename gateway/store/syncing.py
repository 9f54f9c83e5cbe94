"""Appends waiting for their fsync: what becomes visible once durable (:class:`Written`),
telling their callers (:func:`report_when_durable`), and cutting them back when the fsync
failed (:func:`cut_back_unsynced`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gateway.store.disk import describe_fault, fault_kind
from gateway.store.durability import Ticket
from gateway.store.errors import StoreError, StoreIOError
from gateway.store.producers import ProducerTable
from gateway.store.results import AppendResult
from gateway.store.segment import LogSegment
from gateway.store.tail import PartitionTail


@dataclass(slots=True)
class Written:
    """An append waiting for its fsync: what becomes visible once it is durable."""

    end: int
    last_seq: int
    size: int


def report_when_durable(outcomes: list[AppendResult | StoreError],
                        tickets: list[tuple[int, Ticket[Written]]],
                        on_done: Callable[[list[AppendResult | StoreError]], None]) -> None:
    """Call ``on_done(outcomes)`` once the appends behind ``tickets`` are durable, with a
    failed fsync's error in their place. Rounds resolve tickets in order, so the last
    ticket resolving means they all have."""
    if not tickets:
        on_done(outcomes)
        return

    def resolved(last: Ticket[Written]) -> None:
        for i, ticket in tickets:
            if ticket.failed:
                error = ticket.error
                kind = fault_kind(error) if isinstance(error, OSError) else "io_error"
                outcomes[i] = StoreIOError(f"{describe_fault(kind)}: fsync failed: {error}",
                                           kind)
        on_done(outcomes)

    tickets[-1][1].on_resolved = resolved


def cut_back_unsynced(seg: LogSegment, hwm: int, producers: ProducerTable,
                      tail: PartitionTail | None, log: structlog.typing.FilteringBoundLogger
                      ) -> str | None:
    """After a failed fsync, cut active ``seg`` back to what is visible (up to ``hwm``),
    and the producer state records and the cached tail with it. Returns why the
    partition cannot go on (its files could not be cut back), or None."""
    broken = None
    if tail is not None:
        tail.clear()
    try:
        seg.truncate(seg.visible_size, hwm if seg.visible_size else None)
    except OSError as exc:
        broken = f"cannot cut back unsynced bundles: {exc}"
        log.error("partition_broken", error=str(exc))
    try:
        producers.cut(hwm)
    except OSError as exc:
        broken = f"cannot cut back producer state records: {exc}"
        log.error("partition_broken", error=str(exc))
    return broken
