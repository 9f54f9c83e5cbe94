"""Malformed input over raw sockets closes only the offending connection.

The real Figg server crashes on several of these (short ATTACH, topic length past the
payload, empty PING) and accepts a PUBLISH whose data length overruns it. Here each one
closes that connection with a logged reason while another client is served throughout.
"""

from __future__ import annotations

import struct

import pytest
import trio

from protocols.figg.messages import Ack, Attached, Data, Pong
from tests.figg.helpers import RawPeer, attach, figg_server, open_test_backend, ping, publish

HEADER = struct.Struct(">HHI")
MAX_FRAME = 1 << 20


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def raw(kind: int, payload: bytes, *, version: int = 1, length: int | None = None) -> bytes:
    return HEADER.pack(kind, version, len(payload) if length is None else length) + payload


BAD = {
    # ATTACH: u16 flags | u32 len | topic | u64 offset
    "attach_empty": raw(1, b""),
    "attach_short_flags": raw(1, b"\x80"),
    "attach_short_length": raw(1, b"\x80\x00\x00\x00"),
    "attach_topic_past_end": raw(1, b"\x80\x00" + u32(100) + b"t" + u64(0)),
    "attach_missing_offset": raw(1, b"\x80\x00" + u32(1) + b"t"),
    "attach_short_offset": raw(1, b"\x80\x00" + u32(1) + b"t" + b"\0\0\0"),
    "attach_trailing": raw(1, b"\x00\x00" + u32(1) + b"t" + u64(0) + b"!"),
    "attach_not_utf8": raw(1, b"\x00\x00" + u32(2) + b"\xff\xfe" + u64(0)),
    "attach_huge_topic_length": raw(1, b"\x80\x00" + u32(0xFFFFFFFF) + b"t" + u64(0)),
    "attach_invalid_name": attach("../../etc/passwd", 0),
    "attach_invalid_partition": attach("t/x", 0),
    "attach_empty_topic": attach("", 0),
    # DETACH: u32 len | topic
    "detach_empty": raw(3, b""),
    "detach_short_length": raw(3, b"\0\0"),
    "detach_topic_past_end": raw(3, u32(5) + b"ab"),
    "detach_trailing": raw(3, u32(1) + b"ab"),
    # PUBLISH: u32 len | topic | u64 seq | u32 len | data
    "publish_empty": raw(5, b""),
    "publish_topic_past_end": raw(5, u32(0xFFFFFFF0) + b"t"),
    "publish_short_seq": raw(5, u32(1) + b"t" + b"\0\0\0"),
    "publish_missing_data": raw(5, u32(1) + b"t" + u64(1)),
    "publish_data_past_end": raw(5, u32(1) + b"t" + u64(1) + u32(1000) + b"abc"),
    "publish_data_huge_length": raw(5, u32(1) + b"t" + u64(1) + u32(0xFFFFFFFF) + b"abc"),
    "publish_trailing": raw(5, u32(1) + b"t" + u64(1) + u32(1) + b"ab"),
    "publish_invalid_name": publish("has space", 1, b"x"),
    # PING: u64 timestamp
    "ping_empty": raw(8, b""),
    "ping_short": raw(8, b"\0\0\0"),
    "ping_trailing": raw(8, u64(1) + b"x"),
    # Framing
    "huge_header_length": HEADER.pack(5, 1, 0xFFFFFFFF),
    "over_max_frame": HEADER.pack(8, 1, MAX_FRAME + 1) + b"\0" * 64,
    "unknown_type": raw(99, b""),
    "type_zero": raw(0, u64(1)),
    # Messages only a server sends
    "attached_from_client": raw(2, u32(1) + b"t" + u64(0)),
    "detached_from_client": raw(4, u32(1) + b"t"),
    "ack_from_client": raw(6, u64(1)),
    "data_from_client": raw(7, u32(1) + b"t" + u64(1) + u32(1) + b"x"),
    "pong_from_client": raw(9, u64(1)),
    "garbage": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("name", sorted(BAD))
async def test_bad_frame_closes_only_its_connection(tmp_path, name):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, \
                figg_server(backend, max_frame_bytes=MAX_FRAME) as server:
            good = await RawPeer.connect(server)
            await good.send(attach("live", 0))
            assert await good.receive_one() == Attached("live", 0)
            bad = await RawPeer.connect(server)
            await bad.send(BAD[name])
            with trio.fail_after(3):
                await bad.expect_closed()
            # The other client was never disturbed: its subscription and replies go on.
            await good.send(publish("live", 1, b"still here"), ping(42))
            got = await good.receive(3)
            assert Data("live", 1, b"still here") in got and Ack(1) in got and Pong(42) in got
            closed = server.metrics.connections_closed.collect()[0].samples
            kinds = {s.labels["reason"] for s in closed if s.value and
                     s.name.endswith("_total")}
            assert kinds & {"protocol_error", "frame_too_large", "invalid_topic"}, kinds


async def test_good_frames_before_a_bad_one_are_served(tmp_path):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            bad = await RawPeer.connect(server)
            await bad.send(publish("t", 1, b"a"), publish("t", 2, b"b"), ping(9), raw(8, b""))
            got = await bad.receive(3)
            assert sorted(map(repr, got)) == sorted(map(repr, [Ack(1), Ack(2), Pong(9)]))
            await bad.expect_closed()


async def test_any_header_version_is_served(tmp_path):
    # The real Figg server ignores the header's version (issue 15, item 8): so does figtank.
    def versioned(frame: bytes, version: int) -> bytes:
        return frame[:2] + version.to_bytes(2, "big") + frame[4:]

    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            await peer.send(versioned(attach("v", 0), 2), versioned(publish("v", 1, b"a"), 0),
                            versioned(publish("v", 2, b"b"), 2), versioned(ping(7), 0xFFFF))
            got = await peer.receive(6)
            assert got[0] == Attached("v", 0)
            assert sorted(map(repr, got[1:])) == sorted(map(repr, [
                Ack(1), Ack(2), Pong(7), Data("v", 1, b"a"), Data("v", 2, b"b")]))
            await peer.aclose()


async def test_eof_in_the_middle_of_a_frame(tmp_path):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            bad = await RawPeer.connect(server)
            await bad.send(publish("t", 1, b"abcdef")[:-3])
            await bad.stream.send_eof()
            await bad.expect_closed()
            samples = server.metrics.connections_closed.collect()[0].samples
            assert any(s.labels["reason"] == "protocol_error" and s.value for s in samples)


async def test_many_bad_clients_while_one_streams(tmp_path):
    """A subscriber keeps receiving live data while bad clients come and go."""
    with trio.fail_after(20):
        async with open_test_backend(tmp_path) as backend, \
                figg_server(backend, max_frame_bytes=MAX_FRAME) as server:
            sub = await RawPeer.connect(server)
            await sub.send(attach("steady"))
            assert await sub.receive_one() == Attached("steady", 0)
            pub = await RawPeer.connect(server)
            for i, frame in enumerate(BAD.values(), start=1):
                bad = await RawPeer.connect(server)
                await bad.send(frame)
                await pub.send(publish("steady", i, b"%d" % i))
                assert await pub.receive_one() == Ack(i)
                assert await sub.receive_one() == Data("steady", i, b"%d" % i)
                await bad.expect_closed()
