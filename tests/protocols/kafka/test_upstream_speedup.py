"""The compiled plain run of ``records_to_bundles`` (``protocols._speedups.plain_run``)
against its pure-Python reference: the same bundles for every list of client records, and
the same error where the reference refuses one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import native
from protocols.kafka import upstream
from protocols.kafka.batch import InvalidRecord
from protocols.kafka.upstream import ClientRecord, records_to_bundles
from protocols.tank.bundle import decode_chunk


def compiled() -> Any:
    """The compiled function (the suite builds the extension; without it, None)."""
    return getattr(native.speedups, "plain_run", None)


def reference(records: list[ClientRecord], **limits: Any) -> Any:
    """``records_to_bundles`` with the compiled twin out of the way: its bundles, or the
    error it raised (type and text)."""
    saved = upstream._plain_run
    upstream._plain_run = None
    try:
        return records_to_bundles(records, **limits)
    except (InvalidRecord, ValueError) as exc:
        return type(exc), str(exc)
    finally:
        upstream._plain_run = saved


def either(records: list[ClientRecord], **limits: Any) -> Any:
    try:
        return records_to_bundles(records, **limits)
    except (InvalidRecord, ValueError) as exc:
        return type(exc), str(exc)


def test_the_compiled_twin_is_used_when_built() -> None:
    assert (upstream._plain_run is not None) == (native.implementation() == "compiled")


timestamps = st.one_of(st.just(-1), st.just(0), st.sampled_from([1_700_000_000_000]),
                       st.integers(0, 2**63 - 1))
# Around the sizes where the encoding changes (255-byte keys; one- and two-byte lengths),
# the long ones made once: drawing them byte by byte would make the test slow.
keys = st.one_of(st.none(), st.binary(max_size=8),
                 st.sampled_from([b"k" * n for n in (254, 255, 256)]))
values = st.one_of(st.none(), st.binary(max_size=20),
                   st.sampled_from([b"v" * n for n in (126, 127, 128, 129, 16_383, 16_384)]))


@st.composite
def client_records(draw: st.DrawFn) -> list[ClientRecord]:
    """Offsets mostly consecutive, with gaps (and, rarely, going back); timestamps often
    repeated; keys and values of the sizes where the encoding changes."""
    count = draw(st.integers(1, 40))
    offset = draw(st.integers(0, 2**40))
    out: list[ClientRecord] = []
    ts = draw(timestamps)
    for _ in range(count):
        out.append((offset, ts, draw(keys), draw(values)))
        offset += draw(st.sampled_from([1, 1, 1, 1, 2, 7, 0]))
        if draw(st.integers(0, 3)) == 0:
            ts = draw(timestamps)
    return out


@settings(max_examples=200, deadline=None)
@given(client_records(), st.one_of(st.none(), st.integers(0, 2**40)),
       st.integers(1, 20), st.integers(1, 40_000))
def test_compiled_and_reference_agree(records: list[ClientRecord], after_seq: int | None,
                                      max_messages: int, max_bytes: int) -> None:
    limits = {"after_seq": after_seq, "max_messages": max_messages, "max_bytes": max_bytes}
    assert either(records, **limits) == reference(records, **limits)


def test_a_long_plain_run_round_trips() -> None:
    records = [(i, 1_700_000_000_000 + i // 10, None if i % 3 else b"k%d" % i,
                b"v" * (i % 300)) for i in range(5000)]
    bundles = records_to_bundles(records)
    assert bundles == reference(records)
    assert all(b.plain for b in bundles)
    chunk = b"".join(b.framed for b in bundles)
    messages = decode_chunk(chunk, 1).messages
    assert [(m.seq, m.timestamp, m.key, m.value) for m in messages] == [
        (o + 1, ts, k, v) for o, ts, k, v in records]


@pytest.mark.parametrize("records", [
    [(0, 0, b"k" * 256, b"v")],                       # key too long: InvalidRecord
    [(5, 0, None, b"a"), (5, 0, None, b"b")],         # offsets not increasing
    [(0, 0, None, b"a"), (1, 0, None, bytearray(b"b"))],  # not bytes: the reference's
    [(0, 2**64, None, b"a")],                         # timestamp outside int64
])
def test_what_the_compiled_twin_leaves_to_the_reference(records: list[Any]) -> None:
    plain_run = compiled()
    if plain_run is not None:
        assert plain_run(records, 0, 1024, 1 << 20) is None
    assert either(records) == reference(records)
