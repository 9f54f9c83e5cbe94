"""The one-pass Produce run: ``protocols._speedups.tank_produce_run`` against its
reference ``protocols.tank.scan.produce_run_py``, and the reference against the general
path (the request pass and the Produce response builder).

Every input goes through both runs with recording appenders: the same stop position, the
same response bytes, the same count and the same appender calls (bundle bytes and message
count, in order). Inputs: every kind of frame the run must take or stop at, in seeded
random sequences, cut at random ends, with responses limited to every room; seeded random
byte mutations for volume.
"""

from __future__ import annotations

import random
import struct
import time
from typing import Any

import pytest

from gateway.core.contract import ProduceBatch, ProduceCode, ProduceOutcome
from gateway.tank.produce import produce_response_frame_py
from protocols import native
from protocols.tank import scan as S
from protocols.tank.bundle import MAX_UNCOMPRESSED_SIZE, Codec
from protocols.tank.connection import frame
from protocols.tank.messages import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    Ping,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    encode_payload,
)
from tests.store.helpers import bundle, sparse_bundle

compiled = native.built("protocols._speedups")

MAX_PAYLOAD = 1 << 20
VOLUME_SECONDS = 2.0
KNOWN = [("t", 0), ("t", 3), ("ünï", 1), ("x" * 255, 0xFFFF)]


class Appenders(dict):
    """Recording appenders for :data:`KNOWN`: each call is logged; the appender refuses
    (False) the bundles whose message count is in ``refuse``."""

    def __init__(self, refuse: frozenset[int] = frozenset({7})) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, bytes, int]] = []
        for topic, partition in KNOWN:
            self[(topic, partition)] = self._appender(topic, partition, refuse)

    def _appender(self, topic: str, partition: int, refuse: frozenset[int]) -> Any:
        def append(bundle_bytes: bytes, count: int) -> bool:
            assert type(bundle_bytes) is bytes
            self.calls.append((topic, partition, bundle_bytes, count))
            return count not in refuse
        return append


def produce(request_id: int, topics: list[tuple[str, list[tuple[int, bytes]]]],
            client_id: str = "c") -> bytes:
    request = ProduceRequest(2, request_id, client_id, 1, 0, [
        ProduceTopic(name, [ProducePartition(p, b) for p, b in parts])
        for name, parts in topics])
    return frame(*encode_payload(request))


def _patched(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


def frames(rng: random.Random) -> list[tuple[str, bytes]]:
    """Every kind of frame, named; the good ones several times over."""
    rid = rng.randrange(1 << 32)
    good = [(f"good-{topic[:3]}-{partition}-{n}",
             produce(rid + n, [(topic, [(partition, bundle(n, f"v{n}", size=rng.choice(
                 (5, 120, 3000))))])]))
            for n in (1, 2, 3, 12, 17, 130) for topic, partition in KNOWN[:2]]
    good.append(("good-unicode", produce(rid, [("ünï", [(1, bundle(2))])], "ïd")))
    good.append(("good-long-name", produce(rid, [("x" * 255, [(0xFFFF, bundle(1))])])))
    good.append(("good-snappy", produce(rid, [("t", [(0, bundle(20, codec=Codec.SNAPPY))])])))
    ok = produce(5, [("t", [(0, bundle(2))])])
    bad_varint = bytearray(ok)
    at = len(ok) - len(bundle(2)) - 1  # the bundle length byte
    bad_varint[at:at + 1] = bytes([bad_varint[at] | 0x80, 0x00])
    bad_varint[1:5] = struct.pack("<I", len(bad_varint) - 5)
    other = [
        ("refused-by-appender", produce(rid, [("t", [(0, bundle(7))])])),
        ("unknown-partition", produce(rid, [("t", [(1, bundle(2))])])),
        ("unknown-topic", produce(rid, [("u", [(0, bundle(2))])])),
        ("two-partitions", produce(rid, [("t", [(0, bundle(1)), (3, bundle(1))])])),
        ("two-topics", produce(rid, [("t", [(0, bundle(1))]), ("ünï", [(1, bundle(1))])])),
        ("no-topics", produce(rid, [])),
        ("no-partitions", produce(rid, [("t", [])])),
        ("sparse", produce(rid, [("t", [(0, sparse_bundle([10, 12]))])])),
        ("bad-bundle", produce(rid, [("t", [(0, b"\x05garbage")])])),
        ("empty-bundle", produce(rid, [("t", [(0, b"")])])),
        ("bundle-count-too-big",
         produce(rid, [("t", [(0, _patched(bundle(2), 0, b"\x0c"))])])),
        ("client-id-not-utf8", _patched(ok, 12, b"\xff")),
        ("name-not-utf8", produce(rid, [("tA", [(0, bundle(1))])]).replace(
            b"\x02tA", b"\x02t\xff")),
        ("overlong-varint", bytes(bad_varint)),
        ("trailing-byte", ok[:1] + struct.pack("<I", len(ok) - 4) + ok[5:] + b"\x00"),
        ("short-payload", frame(0x01, b"\x02\x00\x05")),
        ("consume", frame(*encode_payload(ConsumeRequest(
            2, rid, "c", 0, 0, topics=[ConsumeTopic("t", [ConsumePartition(0, 1, 4096)])])))),
        ("ping", frame(*encode_payload(Ping()))),
        ("unknown-msg-id", frame(0x7E, b"abc")),
    ]
    return good + other


def run_both(buf: bytes, pos: int, end: int, room: int, max_payload: int = MAX_PAYLOAD,
             refuse: frozenset[int] = frozenset({7})) -> tuple[Any, list[Any]]:
    """Both runs over ``buf[pos:end]``; they must agree. Returns the reference's result and
    appender calls."""
    mine = Appenders(refuse)
    want = S.produce_run_py(buf, pos, end, max_payload, mine, room, MAX_UNCOMPRESSED_SIZE)
    if compiled is not None:
        theirs = Appenders(refuse)
        got = compiled.tank_produce_run(bytearray(buf), pos, end, max_payload, theirs, room,
                                        MAX_UNCOMPRESSED_SIZE)
        assert got == want
        assert theirs.calls == mine.calls
    return want, mine.calls


def test_selected_run() -> None:
    if compiled is None:
        assert S.produce_run is S.produce_run_py
    else:
        assert S.produce_run in (S.produce_run_py, compiled.tank_produce_run)
        assert hasattr(compiled, "tank_produce_run")


def test_every_kind_of_frame_alone() -> None:
    kinds = frames(random.Random(1))
    taken = set()
    for name, data in kinds:
        (pos, responses, count), calls = run_both(data, 0, len(data), 1 << 20)
        if pos:
            taken.add(name)
            assert pos == len(data) and count == 1 and len(calls) == 1
        else:
            assert (responses, count) == (b"", 0)
    assert taken == {name for name, _ in kinds if name.startswith("good")}


def test_taken_requests_match_the_general_path() -> None:
    """What the run appends and answers is what the request pass and the response
    builder make of the same frames."""
    rng = random.Random(2)
    good = [data for name, data in frames(rng) if name.startswith("good")]
    rng.shuffle(good)
    buf = b"".join(good)
    (pos, responses, count), calls = run_both(buf, 0, len(buf), 1 << 20)
    assert (pos, count) == (len(buf), len(good))
    items, end, error = S.scan_requests_py(buf, 0, len(buf), MAX_PAYLOAD, ProduceBatch)
    assert (end, error) == (len(buf), None)
    expected = b""
    for item, call in zip(items, calls, strict=True):
        (batch,) = item.batches
        assert (batch.topic, batch.partition, batch.bundle) == call[:3]
        expected += produce_response_frame_py(item.request_id, item.layout, [
            ProduceOutcome(ProduceCode.OK, 1, call[3])])[0]
    assert responses == expected


def test_random_sequences_cuts_and_rooms() -> None:
    rng = random.Random(3)
    kinds = frames(rng)
    good = [k for k in kinds if k[0].startswith("good")]
    for _ in range(300):
        picked = [rng.choice(good) for _ in range(rng.randrange(0, 6))]
        if rng.random() < 0.7:
            picked.insert(rng.randrange(len(picked) + 1), rng.choice(kinds))
        buf = b"".join(data for _, data in picked)
        prefix = rng.randrange(0, 8)
        buf = bytes(rng.randrange(256) for _ in range(prefix)) + buf
        end = len(buf) if rng.random() < 0.5 else rng.randrange(prefix, len(buf) + 1)
        room = rng.choice((0, 1, 10, 11, 25, 1 << 20))
        (pos, responses, count), calls = run_both(buf, prefix, end, room,
                                                  max_payload=rng.choice((MAX_PAYLOAD, 40)))
        assert prefix <= pos <= end
        assert len(responses) == 10 * count
        assert count <= len(calls)
        if room <= 10:
            assert count <= 1


def test_room_bounds_the_responses() -> None:
    data = b"".join(produce(i, [("t", [(0, bundle(1))])]) for i in range(10))
    for room in range(0, 40):
        (pos, responses, count), _ = run_both(data, 0, len(data), room)
        assert count == min(10, -(-room // 10))
        assert pos == count * len(data) // 10
        assert len(responses) == 10 * count


def test_frame_over_the_limit_is_left_alone() -> None:
    data = produce(1, [("t", [(0, bundle(3))])])
    (pos, _, count), calls = run_both(data, 0, len(data), 100, max_payload=len(data) - 6)
    assert (pos, count, calls) == (0, 0, [])
    (pos, _, count), _ = run_both(data, 0, len(data), 100, max_payload=-1)
    assert (pos, count) == (0, 0)


def test_bounds_outside_the_buffer() -> None:
    if compiled is not None:
        with pytest.raises(ValueError):
            compiled.tank_produce_run(b"abc", 0, 4, MAX_PAYLOAD, {}, 10,
                                      MAX_UNCOMPRESSED_SIZE)


def test_random_mutations() -> None:
    rng = random.Random(4)
    good = [data for name, data in frames(rng) if name.startswith("good")][:6]
    deadline = time.monotonic() + VOLUME_SECONDS
    runs = 0
    while time.monotonic() < deadline or runs < 200:
        buf = bytearray(b"".join(rng.sample(good, 3)))
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        run_both(bytes(buf), 0, len(buf), 1 << 20)
        runs += 1
