"""Exact response bytes over a raw socket, built from protocol-facts.md by hand.

Nothing here uses the project's codec: requests, bundles and expected responses are
written with ``struct`` from the layouts in the notes (all integers little-endian).
"""

from __future__ import annotations

import struct

import trio

from tests.tank.helpers import RunningServer

TS = 1_700_000_000_123


def frame(msg_id: int, payload: bytes) -> bytes:
    return struct.pack("<BI", msg_id, len(payload)) + payload


def str8(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


def one_message_bundle(value: bytes) -> bytes:
    # flags: codec 0, count 1 in bits 2-5; message: flags 0, u64 ts, varint len, value
    return bytes([1 << 2]) + b"\x00" + struct.pack("<Q", TS) + bytes([len(value)]) + value


def produce(request_id: int, topics: list[tuple[str, list[tuple[int, bytes]]]]) -> bytes:
    body = struct.pack("<HI", 2, request_id) + str8("raw") + struct.pack("<BIB", 1, 0,
                                                                         len(topics))
    for name, partitions in topics:
        body += str8(name) + bytes([len(partitions)])
        for partition, bundle in partitions:
            body += struct.pack("<H", partition) + bytes([len(bundle)]) + bundle
    return frame(0x01, body)


def consume(request_id: int, topics: list[tuple[str, list[tuple[int, int, int]]]], *,
            version: int = 2, max_wait_ms: int = 0, min_bytes: int = 0) -> bytes:
    body = struct.pack("<HI", version, request_id) + str8("") + struct.pack(
        "<QI", max_wait_ms, min_bytes)
    if version >= 3:
        body += b"\x00"
    body += bytes([len(topics)])
    for name, partitions in topics:
        body += str8(name) + bytes([len(partitions)])
        for partition, seq, fetch_size in partitions:
            body += struct.pack("<HQI", partition, seq, fetch_size)
    return frame(0x02, body)


async def receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = b""
    with trio.fail_after(5):
        while len(data) < size:
            more = await stream.receive_some(size - len(data))
            assert more, f"closed after {len(data)} of {size} bytes"
            data += more
    return data


async def receive_frame(stream: trio.SocketStream) -> bytes:
    head = await receive_exactly(stream, 5)
    return head + await receive_exactly(stream, struct.unpack_from("<I", head, 1)[0])


async def test_ping_produce_and_consume_bytes(server: RunningServer) -> None:
    stream = await trio.open_tcp_stream(server.host, server.port)
    assert await receive_frame(stream) == b"\x03\x00\x00\x00\x00"  # Ping on accept

    first = one_message_bundle(b"hello")
    await stream.send_all(produce(7, [("raw", [(0, first)])]))
    # u32 reqId | one u8 per partition
    assert await receive_frame(stream) == b"\x01" + struct.pack("<I", 5) + struct.pack(
        "<IB", 7, 0)

    second = one_message_bundle(b"world")
    await stream.send_all(produce(8, [("raw", [(0, second), (5, second)]),
                                      ("bad name", [(0, second), (1, second)])]))
    # partition 5 does not exist (1); the invalid topic gets one 0xff for both partitions
    assert await receive_frame(stream) == b"\x01" + struct.pack("<I", 7) + struct.pack(
        "<IBBB", 8, 0, 1, 0xFF)

    await stream.send_all(consume(9, [("raw", [(0, 1, 1000)])]))
    chunk = bytes([len(first)]) + first + bytes([len(second)]) + second
    header = struct.pack("<IB", 9, 1) + str8("raw") + b"\x01" + struct.pack(
        "<HBQQI", 0, 0, 1, 2, len(chunk))
    payload = struct.pack("<I", len(header)) + header + chunk
    assert await receive_frame(stream) == frame(0x02, payload)
    await stream.aclose()


async def test_consume_error_variants_bytes(server: RunningServer) -> None:
    stream = await trio.open_tcp_stream(server.host, server.port)
    await receive_frame(stream)
    await stream.send_all(produce(1, [("errs", [(0, one_message_bundle(b"x"))])]))
    await receive_frame(stream)
    # version 3 (flags byte): a boundary error, an unknown partition, an unknown topic
    await stream.send_all(consume(2, [("errs", [(0, 5, 100), (3, 1, 100)]),
                                      ("nope", [(0, 1, 100), (1, 1, 100)])], version=3))
    header = (struct.pack("<IB", 2, 2)
              + str8("errs") + b"\x02"
              + struct.pack("<HB", 0, 0x01) + struct.pack("<QQIQ", 0, 1, 0, 1)
              + struct.pack("<HB", 3, 0xFF)
              + str8("nope") + b"\x02" + b"\xff\xff")
    assert await receive_frame(stream) == frame(0x02, struct.pack("<I", len(header)) + header)
    await stream.aclose()


async def test_admin_response_bytes(server: RunningServer) -> None:
    stream = await trio.open_tcp_stream(server.host, server.port)
    await receive_frame(stream)
    # CreateTopic: u32 reqId | str8 topic | u16 n | varint cfgLen | cfg
    cfg = b"log.segment.bytes=1mb\n"
    await stream.send_all(frame(0x07, struct.pack("<I", 3) + str8("adm") + struct.pack(
        "<H", 2) + bytes([len(cfg)]) + cfg))
    assert await receive_frame(stream) == frame(0x07, struct.pack("<I", 3) + str8("adm")
                                                + b"\x00")
    # DiscoverPartitions with an explicit list (1, then 0)
    await stream.send_all(frame(0x06, struct.pack("<I", 4) + str8("adm") + struct.pack(
        "<HH", 1, 0)))
    assert await receive_frame(stream) == frame(0x06, struct.pack("<I", 4) + str8("adm")
                                                + struct.pack("<HQQQQ", 2, 0, 0, 0, 0))
    # ReloadConf of a partition the topic lacks: 10
    await stream.send_all(frame(0x08, struct.pack("<I", 5) + str8("adm") + struct.pack(
        "<H", 9)))
    assert await receive_frame(stream) == frame(0x08, struct.pack("<I", 5) + str8("adm")
                                                + struct.pack("<HB", 9, 10))
    # DiscoverTopics: u32 reqId | u32 n | u8 clusterAware, per topic str8 | u8 | u16
    await stream.send_all(frame(0x0B, struct.pack("<IB", 6, 0)))
    assert await receive_frame(stream) == frame(0x0B, struct.pack("<IIB", 6, 1, 0)
                                                + str8("adm") + struct.pack("<BH", 1, 2))
    # DiscoverTopology, standalone: u32 reqId | u16 0xFFFF
    await stream.send_all(frame(0x0C, struct.pack("<IB", 7, 0)))
    assert await receive_frame(stream) == frame(0x0C, struct.pack("<IH", 7, 0xFFFF))
    # Status: 30 bytes standalone
    await stream.send_all(frame(0x0A, struct.pack("<I", 8)))
    status = await receive_frame(stream)
    assert status[:5] == b"\x0a" + struct.pack("<I", 30)
    request_id, flags, cluster, topics, partitions, open_partitions = struct.unpack_from(
        "<IBBIII", status, 5)
    assert (request_id, flags, cluster, topics, partitions, open_partitions) == (8, 0, 0, 1,
                                                                                 2, 2)
    await stream.aclose()


async def test_produce_with_seqnum_is_answered_as_produce(server: RunningServer) -> None:
    stream = await trio.open_tcp_stream(server.host, server.port)
    await receive_frame(stream)
    bundle = one_message_bundle(b"mirrored")
    # per partition: u16 id | varint bundleLen | u64 firstSeq (not counted) | bundle
    body = (struct.pack("<HI", 2, 11) + str8("") + struct.pack("<BIB", 1, 0, 1)
            + str8("seq") + b"\x01" + struct.pack("<H", 0) + bytes([len(bundle)])
            + struct.pack("<Q", 40) + bundle)
    await stream.send_all(frame(0x05, body))
    assert await receive_frame(stream) == frame(0x01, struct.pack("<IB", 11, 0))
    await stream.send_all(consume(12, [("seq", [(0, 0, 100)])]))
    response = await receive_frame(stream)
    # ... | u16 partition | u8 0 | u64 baseSeq 40 | u64 hwm 40 | u32 chunkLen | chunk
    assert struct.pack("<HBQQ", 0, 0, 40, 40) in response
    assert response.endswith(bundle)
    await stream.aclose()


async def test_one_write_of_produces_around_a_create_topic(server: RunningServer) -> None:
    """Produces read in one pass with a CreateTopic between them: the ones after it wait
    in the connection's lane; every answer comes in request order and the data is there.
    A malformed Produce after a valid one in one write: the valid one is answered, then
    the connection closes."""
    stream = await trio.open_tcp_stream(server.host, server.port)
    await receive_frame(stream)
    create = frame(0x07, struct.pack("<I", 2) + str8("made") + struct.pack("<H", 2) + b"\x00")
    await stream.send_all(produce(0, [("auto", [(0, one_message_bundle(b"zero"))])]))
    assert await receive_frame(stream) == frame(0x01, struct.pack("<IB", 0, 0))
    first = produce(1, [("auto", [(0, one_message_bundle(b"one"))])])
    later = produce(3, [("made", [(1, one_message_bundle(b"two")),
                                  (5, one_message_bundle(b"nope"))])])
    await stream.send_all(first + create + later)
    assert await receive_frame(stream) == frame(0x01, struct.pack("<IB", 1, 0))
    assert await receive_frame(stream) == frame(0x07, struct.pack("<I", 2) + str8("made")
                                                + b"\x00")
    assert await receive_frame(stream) == frame(0x01, struct.pack("<IBB", 3, 0, 1))
    await stream.send_all(produce(5, [("made", [(0, one_message_bundle(b"three"))])])
                          + frame(0x01, b"\x02\x00"))
    assert await receive_frame(stream) == frame(0x01, struct.pack("<IB", 5, 0))
    with trio.fail_after(5):
        assert await stream.receive_some(100) == b""
    await stream.aclose()
    stream = await trio.open_tcp_stream(server.host, server.port)
    await receive_frame(stream)
    await stream.send_all(consume(4, [("made", [(1, 0, 100)])]))
    assert (await receive_frame(stream)).endswith(one_message_bundle(b"two"))
    await stream.aclose()
