"""Records as a Kafka client library hands them over <-> Tank bundles (sans-IO).

figtank's upstream-Kafka backend reads and writes through a client library
(librdkafka), which gives and takes records one at a time, not record batches. This
module is the mapping between those records and the Tank bundles the listeners serve;
it builds on :mod:`protocols.kafka.bundles` (each run of records becomes a
:class:`~protocols.kafka.batch.RecordBatch` and then a bundle by
:func:`~protocols.kafka.bundles.batch_to_bundle`, so the rules of the Kafka listener
apply: offset = sequence - 1, keys at most 255 bytes, timestamps kept).

Reading (:func:`records_to_bundles`, a plain run compiled where the extension is built):
a run of records with consecutive offsets becomes a plain bundle; a run that follows a
gap in the offsets (compaction, transaction markers) becomes a sparse bundle naming its
sequence numbers, so that offsets are never renumbered.
What a Tank message can not hold and other Kafka producers may have written is mapped,
not refused: headers are not carried, a null value reads as an empty one, a record without
a timestamp (-1) reads as timestamp 0. A key over 255 bytes can not be mapped:
:class:`~protocols.kafka.batch.InvalidRecord`.

Writing needs no mapping of its own: a bundle's messages are
:func:`~protocols.tank.bundle.decode_bundle`'s, and each goes to the client library as one
record (value, key, timestamp), in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from protocols.kafka.batch import Record, RecordBatch
from protocols.kafka.bundles import batch_to_bundle
from protocols.native import speedups
from protocols.tank.bundle import Codec, frame_bundle

#: ``(offset, timestamp ms or -1, key, value)``: one record as a client library gives it.
ClientRecord: TypeAlias = tuple[int, int, bytes | None, bytes | None]

#: Messages in one bundle at most (a larger run is split).
MAX_BUNDLE_MESSAGES: Final = 1024
#: Key and value bytes in one bundle at most (a single larger record goes alone).
MAX_BUNDLE_BYTES: Final = 256 * 1024
#: The compiled twin of a plain run's encoding (``protocols._speedups.plain_run``), or
#: None: the pure Python below is the reference (tests/protocols/kafka/
#: test_upstream_speedup.py holds the two to the same bundles).
_plain_run = getattr(speedups, "plain_run", None)


@dataclass(frozen=True, slots=True)
class UpstreamBundle:
    """One framed bundle built from consecutive records of a partition.

    ``plain``: it carries no sequence numbers and starts right after the previous bundle
    of the same call (or is the first), so a chunk starting with it has ``base_seq ==
    first_seq``; otherwise it is sparse.
    """

    first_seq: int
    last_seq: int
    framed: bytes
    plain: bool
    count: int


def records_to_bundles(records: Sequence[ClientRecord], *, after_seq: int | None = None,
                       max_messages: int = MAX_BUNDLE_MESSAGES,
                       max_bytes: int = MAX_BUNDLE_BYTES) -> list[UpstreamBundle]:
    """The bundles holding ``records`` (one partition's, offsets increasing), in order.

    ``after_seq``: the last sequence number of the bundle before these (None: none), so
    that a first run continuing it is plain and one after a gap is sparse. Raises
    :class:`~protocols.kafka.batch.InvalidRecord` for a record Tank can not hold (a key
    over 255 bytes) and ``ValueError`` for offsets that do not increase.
    """
    out: list[UpstreamBundle] = []
    previous = after_seq
    start = 0
    count = len(records)
    compiled = _plain_run if isinstance(records, list) else None
    while start < count:
        if compiled is not None and (previous is None or records[start][0] == previous):
            made = compiled(records, start, max_messages, max_bytes)
            if made is not None:  # else the reference below decides (and raises)
                end, bundle = made
                last_seq = records[end - 1][0] + 1
                out.append(UpstreamBundle(records[start][0] + 1, last_seq,
                                          frame_bundle(bundle), True, end - start))
                previous = last_seq
                start = end
                continue
        end, contiguous = _run(records, start, max_messages, max_bytes)
        run = records[start:end]
        first_seq = run[0][0] + 1
        plain = contiguous and (previous is None or first_seq == previous + 1)
        bundle = batch_to_bundle(_as_batch(run), codec=Codec.NONE, append_time=0,
                                 keep_offsets=not plain)
        last_seq = run[-1][0] + 1
        out.append(UpstreamBundle(first_seq, last_seq, frame_bundle(bundle), plain, len(run)))
        previous = last_seq
        start = end
    return out


def _run(records: Sequence[ClientRecord], start: int, max_messages: int, max_bytes: int
         ) -> tuple[int, bool]:
    """``(end, contiguous)``: where the bundle starting at ``start`` ends, and whether its
    offsets are consecutive. A bundle is cut at the limits and where a gap follows a
    consecutive run (so that the run can go plain)."""
    size = 0
    contiguous = True
    end = start
    limit = min(len(records), start + max_messages)
    while end < limit:
        offset, _, key, value = records[end]
        if end > start:
            step = offset - records[end - 1][0]
            if step <= 0:
                raise ValueError(f"offset {offset} after {records[end - 1][0]}")
            if step != 1:
                if contiguous and end - start > 1:
                    break  # keep the consecutive run plain; the gap opens the next bundle
                contiguous = False
        grown = size + len(key or b"") + len(value or b"")
        if end > start and grown > max_bytes:
            break
        size = grown
        end += 1
    return end, contiguous


def _as_batch(run: Sequence[ClientRecord]) -> RecordBatch:
    base_offset = run[0][0]
    base_ts = max(run[0][1], 0)
    records = [Record(offset - base_offset, max(ts, 0) - base_ts, key,
                      b"" if value is None else value)
               for offset, ts, key, value in run]
    return RecordBatch(base_offset, base_ts, max(max(r[1] for r in run), 0),
                       run[-1][0] - base_offset, records)
