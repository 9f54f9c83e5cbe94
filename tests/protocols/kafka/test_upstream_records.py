"""Records as librdkafka hands them over -> Tank bundles (protocols.kafka.upstream)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.kafka.batch import InvalidRecord, read_batches
from protocols.kafka.bundles import bundles_to_batches
from protocols.kafka.upstream import ClientRecord, records_to_bundles
from protocols.tank.bundle import decode_chunk


def _chunk_of(bundles: list) -> tuple[bytes, int | None]:
    first = bundles[0]
    return b"".join(b.framed for b in bundles), first.first_seq if first.plain else None


def _decoded(records: list[ClientRecord], **kwargs: int) -> list[tuple[int, bytes | None,
                                                                          bytes, int]]:
    bundles = records_to_bundles(records, **kwargs)
    chunk, base = _chunk_of(bundles)
    result = decode_chunk(chunk, base)
    assert result.consumed == len(chunk) and result.partial_bundle_len is None
    return [(m.seq, m.key, m.value, m.timestamp) for m in result.messages]


def test_consecutive_offsets_are_one_plain_bundle_numbered_offset_plus_one() -> None:
    records = [(41, 1000, b"k", b"a"), (42, 1001, None, b"b"), (43, 1005, b"", b"c")]
    bundles = records_to_bundles(records)
    assert [(b.first_seq, b.last_seq, b.plain, b.count) for b in bundles] == [(42, 44, True, 3)]
    assert _decoded(records) == [(42, b"k", b"a", 1000), (43, None, b"b", 1001),
                                 (44, b"", b"c", 1005)]


def test_a_gap_in_offsets_starts_a_sparse_bundle_and_keeps_every_offset() -> None:
    records = [(0, 5, None, b"a"), (1, 5, None, b"b"), (7, 6, None, b"c"), (8, 6, None, b"d")]
    bundles = records_to_bundles(records)
    assert [(b.first_seq, b.last_seq, b.plain) for b in bundles] == [(1, 2, True),
                                                                     (8, 9, False)]
    assert [seq for seq, *_ in _decoded(records)] == [1, 2, 8, 9]


def test_after_seq_says_whether_the_first_run_continues_the_previous_bundle() -> None:
    records = [(10, 0, None, b"x"), (11, 0, None, b"y")]
    assert records_to_bundles(records, after_seq=10)[0].plain
    follows_gap = records_to_bundles(records, after_seq=5)
    assert not follows_gap[0].plain
    assert [seq for seq, *_ in _decoded(records, after_seq=5)] == [11, 12]


def test_runs_are_cut_at_the_message_and_byte_limits() -> None:
    records = [(i, 0, None, b"v" * 10) for i in range(10)]
    by_count = records_to_bundles(records, max_messages=4)
    assert [b.count for b in by_count] == [4, 4, 2]
    assert all(b.plain for b in by_count)  # each continues the one before
    by_bytes = records_to_bundles(records, max_bytes=25)
    assert [b.count for b in by_bytes] == [2, 2, 2, 2, 2]
    big = records_to_bundles([(0, 0, None, b"v" * 100)], max_bytes=25)
    assert [b.count for b in big] == [1]  # a record over the limit goes alone


def test_what_tank_can_not_hold_is_mapped_not_refused() -> None:
    # A null value reads as empty; a record without a timestamp as time 0.
    assert _decoded([(0, -1, b"k", None)]) == [(1, b"k", b"", 0)]


def test_a_key_over_255_bytes_is_refused() -> None:
    with pytest.raises(InvalidRecord, match="key of 256 bytes"):
        records_to_bundles([(0, 0, b"k" * 256, b"v")])


def test_offsets_must_increase() -> None:
    with pytest.raises(ValueError, match="offset 3 after 3"):
        records_to_bundles([(3, 0, None, b"a"), (3, 0, None, b"b")])


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(-1, 2**41),
                          st.one_of(st.none(), st.binary(max_size=20)),
                          st.one_of(st.none(), st.binary(max_size=50))),
                min_size=1, max_size=60),
       st.integers(0, 2**40))
def test_kafka_offsets_survive_the_trip_to_bundles_and_back(
        rows: list[tuple[int, int, bytes | None, bytes | None]], start: int) -> None:
    """What a Kafka client fetches through the gateway has the upstream's offsets,
    keys, values and timestamps (null values empty, missing timestamps 0)."""
    offset = start
    records: list[ClientRecord] = []
    for step, ts, key, value in rows:
        records.append((offset, ts, key, value))
        offset += step
    bundles = records_to_bundles(records, max_messages=7, max_bytes=200)
    chunk, base = _chunk_of(bundles)
    fetched = bundles_to_batches(chunk, base)
    run = read_batches(bytes(fetched.records))
    got = [(b.base_offset + r.offset_delta, b.base_timestamp + r.timestamp_delta, r.key,
            r.value) for b in run.batches for r in b.records]
    assert got == [(o, max(ts, 0), k, v or b"") for o, ts, k, v in records]
