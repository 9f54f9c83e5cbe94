"""The Tank listener's one-pass Produce path against its general path, over the real
listener, a real store in ``tmp_path`` and a raw loopback socket.

The same byte stream, sent in the same pieces, must get the same response bytes, leave
the same files in the data directory and count the same requests and messages whether
``TankSession.fast_produce`` is on or off. The stream mixes what the one-pass path takes
(runs of single-partition Produces to partitions the connection produced to before) with
everything that must leave it to the general path: a partition not seen yet, a topic that
does not exist (created on the fly), two partitions in one request, a bad bundle, a sparse
bundle, a Consume between Produces, segment rolls, a frame cut across reads.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.tank.session import FAST_PARTITIONS, TankSession
from protocols.tank import connection as tank_connection
from protocols.tank.connection import frame
from protocols.tank.messages import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    encode_payload,
)
from tests.store.helpers import bundle, sparse_bundle
from tests.tank.helpers import tank_server

SEGMENT_BYTES = 64 * 1024


def produce(request_id: int, topics: list[tuple[str, list[tuple[int, bytes]]]]) -> bytes:
    return frame(*encode_payload(ProduceRequest(2, request_id, "fast", 1, 0, [
        ProduceTopic(name, [ProducePartition(p, b) for p, b in parts])
        for name, parts in topics])))


def consume(request_id: int, topic: str, partition: int, seq: int) -> bytes:
    return frame(*encode_payload(ConsumeRequest(2, request_id, "fast", 0, 0, topics=[
        ConsumeTopic(topic, [ConsumePartition(partition, seq, 1 << 20)])])))


def script(seed: int) -> list[bytes]:
    """The requests, in order: a seeded mix."""
    rng = random.Random(seed)
    out = []
    rid = 0

    def nxt() -> int:
        nonlocal rid
        rid += 1
        return rid

    for round_ in range(12):
        for _ in range(rng.randrange(5, 40)):
            partition = rng.choice((0, 0, 0, 1))
            out.append(produce(nxt(), [("t", [(partition, bundle(
                rng.randrange(1, 20), f"r{round_}-", size=rng.choice((10, 300, 2500))))])]))
        kind = round_ % 6
        if kind == 0:
            out.append(produce(nxt(), [("t", [(0, b"\x09not a bundle")])]))
        elif kind == 1:
            out.append(produce(nxt(), [("t", [(0, bundle(2)), (1, bundle(3))])]))
        elif kind == 2:
            out.append(consume(nxt(), "t", 0, rng.randrange(1, 50)))
        elif kind == 3:
            out.append(produce(nxt(), [(f"new{round_}", [(0, bundle(4))])]))
        elif kind == 4:
            out.append(produce(nxt(), [("t", [(1, sparse_bundle([900_000, 900_002]))])]))
        else:
            out.append(produce(nxt(), [("t", [(7, bundle(1))])]))  # no such partition
    return out


def pieces(stream: bytes, seed: int) -> list[bytes]:
    """``stream`` cut at random places (some cuts inside frames)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(stream)), 40))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


Served = tuple[bytes, dict[str, bytes], dict[str, float | None], int]


async def _serve(tmp_path: Path, requests: list[bytes], *, fast: bool,
                 monkeypatch: pytest.MonkeyPatch) -> Served:
    """Send ``requests`` in pieces; the responses, the data directory's files, the
    request and message counts, and how many requests the one-pass path took."""
    monkeypatch.setattr(TankSession, "fast_produce", fast)
    taken: list[int] = []
    real = tank_connection.TankConnection.serve_produces

    def counted(self: Any, data: bytes, start: int, appenders: Any, room: int) -> Any:
        result = real(self, data, start, appenders, room)
        taken.append(result[2])
        return result

    monkeypatch.setattr(tank_connection.TankConnection, "serve_produces", counted)
    stream = b"".join(requests)
    data_dir = tmp_path / ("fast" if fast else "reference")
    async with tank_server(data_dir, auto_create_topics="any") as server:
        assert await server.backend.create_topic(
            "t", 2, f"log.segment.bytes={SEGMENT_BYTES}") == 0
        received = bytearray()
        async with await trio.open_tcp_stream(server.host, server.port) as sock:
            for piece in pieces(stream, 8):
                await sock.send_all(piece)
                await trio.sleep(0.002)  # let some pieces arrive as reads of their own
            with trio.fail_after(10):
                while _frames(received) < len(requests) + 1:  # + the server's Ping
                    received += await sock.receive_some(1 << 16)
        metrics = {name: server.metric(name) for name in (
            'figtank_requests_total{protocol="tank",result="ok",type="produce"}',
            'figtank_requests_total{protocol="tank",result="error",type="produce"}',
            'figtank_messages_in_total{topic="t"}', 'figtank_bytes_in_total{topic="t"}')}
    files = {}
    for root, _, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:  # a rolled segment's name ends with its creation time
                files[re.sub(r"_\d+\.", "_T.", os.path.relpath(path, data_dir))] = f.read()
    return bytes(received), files, metrics, sum(taken)


def _split(data: bytes | bytearray) -> list[bytes]:
    """The complete frames at the start of ``data``."""
    out = []
    pos = 0
    while len(data) - pos >= 5:
        end = pos + 5 + int.from_bytes(data[pos + 1:pos + 5], "little")
        if end > len(data):
            break
        out.append(bytes(data[pos:end]))
        pos = end
    return out


def _frames(data: bytearray) -> int:
    return len(_split(data))


def _by_request(data: bytes) -> list[bytes]:
    """The response frames in request order: a Produce to a topic being created is
    answered once it exists, after the requests behind it to other topics (either path),
    so only the order of the responses to one partition's appends is fixed (the files
    say that)."""
    return sorted(_split(data), key=lambda f: (f[0], f[5:9] if f[0] == 1 else f))


async def test_one_pass_produces_match_the_general_path(tmp_path, monkeypatch):
    requests = script(7)
    fast = await _serve(tmp_path, requests, fast=True, monkeypatch=monkeypatch)
    reference = await _serve(tmp_path, requests, fast=False, monkeypatch=monkeypatch)
    assert _by_request(fast[0]) == _by_request(reference[0])
    assert sorted(fast[1]) == sorted(reference[1])
    for name in fast[1]:
        assert fast[1][name] == reference[1][name], name
    assert len([name for name in fast[1] if name.endswith(".ilog")]) > 5  # segments rolled
    assert fast[2] == reference[2]
    assert all(fast[2].values())
    assert reference[3] == 0
    # The one-pass path took many of the Produces (how many depends on how the reads fall
    # and what is still being appended: 38 to 90 of them seen, fewer on a busy machine).
    assert fast[3] >= 10


async def test_a_connection_keeps_appenders_for_a_bounded_number_of_partitions(
        tmp_path, monkeypatch):
    sessions: list[TankSession] = []
    real = TankSession._learn_appender

    def learn(self: TankSession, topic: str, partition: int) -> None:
        sessions.append(self)
        real(self, topic, partition)

    monkeypatch.setattr(TankSession, "_learn_appender", learn)
    partitions = FAST_PARTITIONS + 6
    async with tank_server(tmp_path / "data") as server:
        assert await server.backend.create_topic("wide", partitions) == 0
        async with await trio.open_tcp_stream(server.host, server.port) as sock:
            rid = 0
            for _ in range(2):
                for partition in range(partitions):
                    rid += 1
                    await sock.send_all(produce(rid, [("wide", [(partition, bundle(2))])]))
                    with trio.fail_after(5):
                        got = b""
                        while len(got) < 10 or (rid == 1 and len(got) < 15):
                            got += await sock.receive_some(64)
                    assert got.endswith(produce_ok(rid))
            assert len(sessions[0]._appenders) == FAST_PARTITIONS
        store = server.backend.store
        assert [store.partition("wide", p).high_water_mark for p in range(partitions)] == [
            4] * partitions


def produce_ok(request_id: int) -> bytes:
    return frame(0x01, request_id.to_bytes(4, "little") + b"\x00")
