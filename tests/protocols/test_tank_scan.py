"""The Tank request pass and Produce response builder: compiled twins against their
references (``protocols.tank.scan.scan_requests_py``,
``gateway.tank.produce.produce_response_frame_py``).

Every input goes through both and must give the same items, the same stop position and
the same error (class and text), or the same response frame and OK flag. Inputs: valid
Produce requests (hypothesis) alone and among other requests, cut at every byte; every
kind of malformed Produce payload by hand; seeded random mutations for volume. Under
``FIGTANK_PURE_PYTHON`` the comparisons still run when the extension imports; the
references are checked against the record path they replace either way.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.contract import ProduceBatch, ProduceCode, ProduceOutcome
from gateway.tank import produce as P
from protocols import native
from protocols.connection import CLOSED, Role
from protocols.errors import FrameTooLarge, ProtocolError
from protocols.tank import scan as S
from protocols.tank.connection import TankConnection, frame
from protocols.tank.messages import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    MsgId,
    Ping,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    encode_payload,
)

compiled = native.built("protocols._speedups")
PURE = native.pure_python_requested()
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_PAYLOAD = 1 << 20
VOLUME_SECONDS = 2.0


@pytest.fixture(autouse=True, scope="module")
def _compiled_in_scan() -> Iterator[None]:
    # _compiled_scan calls whatever scan.speedups is: the extension, also in pure mode.
    with mock.patch.object(S, "speedups", compiled):
        yield


def run(fn: Any, *args: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(*args))
    except (ProtocolError, ValueError) as exc:
        return ("error", type(exc), str(exc))


def same_scan(buf: bytes, pos: int = 0, end: int | None = None,
              max_payload: int = MAX_PAYLOAD) -> tuple[list[Any], int, Any]:
    """Both passes over ``buf[pos:end]``; they must agree. Returns the reference's."""
    end = len(buf) if end is None else end
    items, stop, error = S.scan_requests_py(buf, pos, end, max_payload, ProduceBatch)
    if compiled is not None:
        got_items, got_stop, got_error = S._compiled_scan(bytearray(buf), pos, end,
                                                         max_payload, ProduceBatch)
        assert got_items == items
        assert type(got_error) is type(error) and str(got_error) == str(error)
        if error is None:
            assert got_stop == stop
    return items, stop, error


def same_response(request_id: int, layout: Any, outcomes: list[Any]) -> tuple[Any, ...]:
    expected = run(P.produce_response_frame_py, request_id, layout, outcomes)
    if compiled is not None:
        got = run(compiled.tank_produce_response, request_id, layout, outcomes)
        assert got == expected, f"compiled {got!r} != reference {expected!r}"
    return expected


def produce_frame(request: ProduceRequest) -> bytes:
    return frame(*encode_payload(request))


# ------------------------------------------------------------------------- selection


def test_selected_functions() -> None:
    if native.speedups is None:
        assert S.scan_requests is S.scan_requests_py
        assert P.produce_response_frame is P.produce_response_frame_py
    else:
        assert S.scan_requests is S._compiled_scan
        assert P.produce_response_frame is native.speedups.tank_produce_response
    if not PURE:
        assert compiled is not None and hasattr(compiled, "scan_tank_requests")


# ------------------------------------------------------------------------- the pass

names = st.text(max_size=12).filter(lambda s: len(s.encode()) <= 255)
bundles = st.one_of(st.binary(max_size=40), st.binary(min_size=130, max_size=300))
partitions = st.lists(st.builds(ProducePartition, st.integers(0, 0xFFFF), bundles),
                      max_size=4)
requests = st.builds(ProduceRequest, st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF),
                     names, st.integers(0, 255), st.integers(0, 0xFFFFFFFF),
                     st.lists(st.builds(ProduceTopic, names, partitions), max_size=4))


@FAST
@given(requests)
def test_produce_pass_matches_the_record(request: ProduceRequest) -> None:
    buf = produce_frame(request)
    items, stop, error = same_scan(buf)
    assert error is None and stop == len(buf) and len(items) == 1
    produce = items[0]
    assert type(produce) is S.ProducePass
    assert produce.as_request() == request
    assert produce.batches == [ProduceBatch(t.name, p.partition, p.bundle)
                               for t in request.topics for p in t.partitions]
    assert produce.size == sum(len(p.bundle) for t in request.topics for p in t.partitions)


small = st.builds(ProduceRequest, st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF), names,
                  st.integers(0, 255), st.integers(0, 0xFFFFFFFF),
                  st.lists(st.builds(ProduceTopic, names, st.lists(st.builds(
                      ProducePartition, st.integers(0, 0xFFFF), st.binary(max_size=20)),
                      max_size=2)), max_size=2))


@settings(FAST, max_examples=25)
@given(st.lists(small, min_size=1, max_size=2))
def test_stream_cut_at_every_byte(batch: list[ProduceRequest]) -> None:
    others = [frame(*encode_payload(Ping())), frame(*encode_payload(ConsumeRequest(
        2, 7, "c", 0, 0, [ConsumeTopic("t", [ConsumePartition(0, 1, 100)])])))]
    buf = b"".join(produce_frame(r) + others[i % 2] for i, r in enumerate(batch))
    for cut in range(len(buf) + 1):
        items, stop, error = same_scan(buf, 0, cut)
        assert error is None and stop <= cut
    items, stop, _ = same_scan(b"xx" + buf, 2)
    assert stop == len(buf) + 2
    assert [type(i) for i in items] == [S.ProducePass, tuple] * len(batch)


def _payload(request: ProduceRequest) -> bytes:
    return encode_payload(request)[1]


GOOD = ProduceRequest(2, 9, "cli", 1, 0, [ProduceTopic("orders", [
    ProducePartition(0, b"a" * 200), ProducePartition(3, b"bc")])])

BAD_PAYLOADS = {
    "short": b"\x02\x00\x01",
    "client id overruns": b"\x02\x00\x01\x00\x00\x00\x09ab",
    "topic not UTF-8": _payload(GOOD).replace(b"orders", b"ord\xffrs"),
    "client id not UTF-8": _payload(GOOD).replace(b"cli", b"c\xc3i"),
    "trailing byte": _payload(GOOD) + b"\x00",
    "topic count lies": _payload(ProduceRequest(2, 9, "", 0, 0, []))[:-1] + b"\xff",
    "over-long varint": _payload(GOOD).replace(b"\x03\x00\x02bc", b"\x03\x00\x82\x00bc"),
    "varint past the end": _payload(GOOD)[:-3] + b"\x80",
    "bundle overruns": _payload(GOOD)[:-1],
}


@pytest.mark.parametrize("case", sorted(BAD_PAYLOADS))
def test_malformed_produce_same_error(case: str) -> None:
    payload = BAD_PAYLOADS[case]
    ok = produce_frame(GOOD)
    items, _, error = same_scan(ok + frame(MsgId.PRODUCE, payload) + ok)
    assert isinstance(error, ProtocolError)
    assert len(items) == 1 and items[0].as_request() == GOOD


def test_long_varints_go_to_the_reference() -> None:
    # A 6-byte varint the reference accepts (a small value written long is refused, so
    # use a real length): the compiled pass hands it over and reports the same.
    big = b"z" * (1 << 21)
    payload = _payload(ProduceRequest(2, 1, "", 0, 0, [ProduceTopic("t", [
        ProducePartition(1, big)])]))
    items, _, error = same_scan(frame(MsgId.PRODUCE, payload), max_payload=1 << 23)
    assert error is None and items[0].batches[0].bundle == big
    overflow = payload[:payload.index(b"\x01\x00", 10) + 2] + b"\xff" * 10 + b"\x01"
    _, _, error = same_scan(frame(MsgId.PRODUCE, overflow))
    assert isinstance(error, ProtocolError)


def test_frame_over_the_limit_stops_before_its_payload() -> None:
    header = struct.pack("<BI", MsgId.PRODUCE, 1 << 30)
    items, _, error = same_scan(produce_frame(GOOD) + header, max_payload=1 << 20)
    assert type(error) is FrameTooLarge
    assert str(error) == f"frame payload of {1 << 30} bytes exceeds the maximum of {1 << 20}"
    assert len(items) == 1


def test_random_mutations() -> None:
    rng = random.Random(27)
    base = produce_frame(GOOD) + frame(*encode_payload(Ping())) + produce_frame(
        ProduceRequest(2, 10, "", 0, 0, [ProduceTopic("é", [ProducePartition(1, b"x")])]))
    deadline = time.monotonic() + VOLUME_SECONDS
    runs = 0
    while time.monotonic() < deadline and runs < 20_000:
        buf = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        same_scan(bytes(buf), 0, rng.randint(0, len(buf)), rng.choice((64, MAX_PAYLOAD)))
        runs += 1
    assert runs > 100


def test_connection_reports_the_error_after_the_requests_before_it() -> None:
    conn = TankConnection(Role.SERVER)
    conn.receive_data(produce_frame(GOOD) + frame(MsgId.PRODUCE, BAD_PAYLOADS["short"]))
    events, error = conn.next_requests(ProduceBatch)
    assert [e.as_request() for e in events] == [GOOD]
    assert isinstance(error, ProtocolError)
    with pytest.raises(ProtocolError, match="already failed"):
        conn.next_requests(ProduceBatch)
    unknown = TankConnection(Role.SERVER)
    unknown.receive_data(frame(0x42, b"") + produce_frame(GOOD))
    events, error = unknown.next_requests(ProduceBatch)
    assert events == [] and str(error) == "unknown Tank request msgId 0x42"


# ------------------------------------------------------------------------- the response

codes = st.sampled_from([0, 1, 2, 3, 10, 0xFE, 0xFF])


@FAST
@given(st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 0xFFFF), codes),
                                          max_size=4)), max_size=4),
       st.integers(0, 0xFFFFFFFF))
def test_response_matches_the_record_path(topics: list[Any], request_id: int) -> None:
    layout = tuple((name, tuple(p for p, _ in parts)) for name, parts in topics)
    outcomes = [ProduceOutcome(ProduceCode(c)) for _, parts in topics for _, c in parts]
    expected = same_response(request_id, layout, outcomes)
    request = ProduceRequest(2, request_id, "", 0, 0, [ProduceTopic(name, [
        ProducePartition(p, b"") for p, _ in parts]) for name, parts in topics])
    old = TankConnection(Role.SERVER).send(P.produce_response(request, outcomes))
    assert expected == ("ok", (old, P.all_ok(outcomes)))


@pytest.mark.parametrize("topics", [100, 255])
def test_a_response_longer_than_a_byte_counts(topics: int) -> None:
    # A bridge sends hundreds of bundles in one Produce after an outage: the frame's
    # length must not be taken as one byte (a Produce names up to 255 topics of up to
    # 255 partitions each).
    layout = tuple((f"t{i}", (0, 1, 2)) for i in range(topics))
    codes = [ProduceCode.OK, ProduceCode.IO_FAULT, ProduceCode.UNKNOWN_PARTITION]
    outcomes = [ProduceOutcome(codes[i % 3]) for i in range(3 * topics)]
    kind, (frame_bytes, ok) = same_response(0x01020304, layout, outcomes)
    assert kind == "ok" and not ok
    assert int.from_bytes(frame_bytes[1:5], "little") == len(frame_bytes) - 5 > 255


def test_response_errors() -> None:
    layout = (("t", (0, 1)),)
    ok = [ProduceOutcome(ProduceCode.OK)] * 2
    assert same_response(1, layout, ok[:1]) == (
        "error", ValueError, "1 outcomes for the 2 partitions requested")
    leader = mock.Mock(code=0xFC)
    assert same_response(1, layout, [ok[0], leader])[0] == "error"
    assert same_response(1, layout, [ok[0], mock.Mock(code=256)])[0] == "error"
    assert same_response(1, (), []) == ("ok", (b"\x01\x04\x00\x00\x00\x01\x00\x00\x00",
                                                True))


# ------------------------------------------------------------------------- reads in place


def _same_reads(reads: list[bytes], max_frame: int = MAX_PAYLOAD) -> list[Any]:
    """Each read through ``receive_requests`` and through ``receive_data`` then
    ``next_requests`` (the reference): the same requests, errors and partial frame."""
    fast = TankConnection(Role.SERVER, max_frame_size=max_frame)
    ref = TankConnection(Role.SERVER, max_frame_size=max_frame)
    out: list[Any] = []
    for data in reads:
        got = run(fast.receive_requests, data, ProduceBatch)
        ref.receive_data(data)
        expected = run(ref.next_requests, ProduceBatch)
        if expected[0] == "ok":
            assert got[0] == "ok"
            (items, error), (want, want_error) = got[1], expected[1]
            assert items == want
            assert type(error) is type(want_error) and str(error) == str(want_error)
            out += items
            if error is not None:
                break  # the connection is unusable: what it buffered no longer counts
        else:
            assert got == expected
            break
        assert fast.buffered == ref.buffered
    return out


def test_reads_scanned_in_place_match_the_buffered_path() -> None:
    rng = random.Random(2711)
    ping = frame(*encode_payload(Ping()))
    consume = frame(*encode_payload(ConsumeRequest(
        2, 7, "c", 0, 0, [ConsumeTopic("t", [ConsumePartition(0, 1, 100)])])))
    stream = produce_frame(GOOD) + ping + consume + produce_frame(
        ProduceRequest(2, 10, "", 0, 0, [ProduceTopic("é", [ProducePartition(1, b"x" * 300)])]))
    whole = _same_reads([stream, b""])
    assert [type(i) for i in whole] == [S.ProducePass, Ping, ConsumeRequest, S.ProducePass,
                                        type(CLOSED)]
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(0, 4)))
        reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert _same_reads([*reads, b""]) == whole
    # errors: a bad Produce after good requests, a frame over the limit, EOF mid-frame
    bad = frame(MsgId.PRODUCE, BAD_PAYLOADS["short"])
    assert len(_same_reads([produce_frame(GOOD) + bad + ping])) == 1
    assert _same_reads([ping + struct.pack("<BI", 1, 1 << 30)], max_frame=1 << 10) == [Ping()]
    assert _same_reads([ping + stream[:7], b""])[0] == Ping()
    conn = TankConnection(Role.SERVER)  # a failed connection stays failed
    conn.receive_requests(bad, ProduceBatch)
    with pytest.raises(ProtocolError, match="already failed"):
        conn.receive_requests(ping, ProduceBatch)
