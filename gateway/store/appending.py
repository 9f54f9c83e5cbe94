"""Append planning: what an append is (:data:`AppendEntry`), and where its bundle goes
under which sequence numbers (:func:`plan_append`).

The partition executes the plans (:meth:`gateway.store.partition.Partition.append_nowait`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import structlog

from gateway.store.config import TopicConfig
from gateway.store.durability import Ticket
from gateway.store.errors import BundleTooLarge, InvalidBundle, InvalidSequence, StoreError
from gateway.store.index import ENTRY_SIZE
from gateway.store.producers import ProducerBatch
from gateway.store.results import AppendResult
from gateway.store.segment import MAX_REL_SEQ, LogSegment
from gateway.store.syncing import Written
from protocols.errors import ProtocolError
from protocols.tank.bundle import (
    BundleInfo,
    Codec,
    decode_bundle,
    encode_bundle,
    validate_bundle,
)
from protocols.wire import UINT64_MAX, encode_varint, varint_size

#: The largest sequence number a client may choose (a sparse bundle's, or ProduceWithSeqnum's
#: base): INT64_MAX, as Kafka's signed offsets. Beyond it a partition could take so few
#: further messages that one produce would block it for good.
MAX_CHOSEN_SEQ: Final = (1 << 63) - 1

#: ``(bundle, base_seq)``, or ``(bundle, base_seq, info)`` for a bundle the caller built,
#: or ``(bundle, base_seq, info, producer)`` for an idempotent producer's batch.
AppendEntry = (tuple[bytes, int | None] | tuple[bytes, int | None, BundleInfo | None]
               | tuple[bytes, int | None, BundleInfo | None, ProducerBatch | None])
AppendOutcome = AppendResult | StoreError


class MustWait(Exception):
    """The next bundle needs the pending fsyncs drained first (a segment roll)."""

    def __init__(self) -> None:
        super().__init__("the pending fsyncs must finish first")
        self.outcomes: list[AppendOutcome] = []
        self.tickets: list[tuple[int, Ticket[Written]]] = []


@dataclass(slots=True)
class Plan:
    """Where one bundle goes: its sequence numbers, the bytes to store, and the segment
    change before it."""

    first: int
    last: int
    data: bytes
    #: None, "create" (no active segment), "replace" (empty active with another base),
    #: or a roll reason.
    action: str | None


def varint(n: int) -> bytes:
    """:func:`~protocols.wire.encode_varint` with the usual sizes unrolled."""
    if n < 0x4000:
        return bytes((n,)) if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14))
    return encode_varint(n)


def too_large(bundle: bytes, max_size: int) -> BundleTooLarge:
    """The error for ``bundle`` over ``max_size`` bytes."""
    return BundleTooLarge(f"bundle of {len(bundle)} bytes is over the {max_size} byte limit")


def check_bundle(bundle: bytes, max_size: int) -> BundleInfo:
    """``bundle``'s header, once it is known to be valid and within ``max_size`` bytes
    (else :class:`BundleTooLarge`, :class:`InvalidBundle`)."""
    if len(bundle) > max_size:
        raise too_large(bundle, max_size)
    try:
        return validate_bundle(bundle)
    except ProtocolError as exc:
        raise InvalidBundle(str(exc)) from None


def plan_append(info: BundleInfo, bundle: bytes, base_seq: int | None, hwm: int,
                active: LogSegment | None, roll_at: float, now: float, config: TopicConfig,
                max_size: int, log: structlog.typing.FilteringBoundLogger) -> Plan:
    """Plan the append of valid ``bundle`` (header ``info``) after the written high-water
    mark ``hwm``, with ``base_seq`` if the producer chose it (else None), to ``active``
    (which rolls by age at ``roll_at``). Raises :class:`InvalidSequence` for sequence
    numbers not above ``hwm`` or out of range, :class:`BundleTooLarge` for a gapped bundle
    too large once stored sparse."""
    if info.sparse:
        assert info.first_seq is not None and info.last_seq is not None
        first, last = info.first_seq, info.last_seq
        if base_seq is not None and base_seq != first:
            raise InvalidSequence(f"base sequence {base_seq} differs from the sparse "
                                  f"bundle's first sequence {first}")
    else:
        first = hwm + 1 if base_seq is None else base_seq
        last = first + info.msg_count - 1
    if first <= hwm:
        raise InvalidSequence(f"first sequence {first} is not above the "
                              f"high-water mark {hwm}")
    if last > MAX_CHOSEN_SEQ and (info.sparse or base_seq is not None):
        log.warning("produce_sequence_refused", first_seq=first, last_seq=last,
                    max_seq=MAX_CHOSEN_SEQ)
        raise InvalidSequence(f"sequence number {last} is over {MAX_CHOSEN_SEQ}, the "
                              "largest a producer may choose")
    if last >= UINT64_MAX:
        raise InvalidSequence(f"sequence number {last} out of range")
    framed = varint_size(len(bundle)) + len(bundle)
    action = segment_action(active, first, last, framed, roll_at, now, config)
    if not info.sparse and first != hwm + 1 and action is None:
        # A plain bundle's sequence numbers are implicit (counted from the previous
        # bundle), so one that leaves a gap is stored sparse, unless it opens a
        # segment whose base names its first sequence number.
        data = _as_sparse(bundle, first, info.codec, max_size)
        framed = varint_size(len(data)) + len(data)
        action = segment_action(active, first, last, framed, roll_at, now, config)
        if action is None:
            return Plan(first, last, data, None)
    return Plan(first, last, bundle, action)


def segment_action(seg: LogSegment | None, first: int, last: int, framed: int,
                   roll_at: float, now: float, config: TopicConfig) -> str | None:
    """The segment change appending ``framed`` bytes holding ``first..last`` to active
    ``seg`` needs first (see :attr:`Plan.action`), or None."""
    if seg is None:
        return "create"
    if seg.size == 0:
        return None if seg.base == first else "replace"
    if seg.size + framed > config.segment_bytes:
        return "size"
    if seg.index().size_bytes + ENTRY_SIZE > config.index_max_bytes:
        return "index full"
    if last - seg.base > MAX_REL_SEQ:
        return "sequence range"
    if now >= roll_at:
        return "age"
    return None


def _as_sparse(bundle: bytes, first: int, codec: Codec, max_size: int) -> bytes:
    messages = decode_bundle(bundle, first)
    data = encode_bundle(messages, codec=codec, sparse=True)
    if len(data) > max_size:
        raise BundleTooLarge("bundle over the size limit once stored sparse")
    return data
