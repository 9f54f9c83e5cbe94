"""The Kafka server connection: framing fed whole, byte by byte and in random splits; the
frame limit; unsupported API keys and versions as events; EOF handling; and fuzz (random
bytes, mutated valid requests) that never raises anything but ProtocolError."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from protocols.connection import CLOSED, NEED_DATA
from protocols.errors import FrameTooLarge, ProtocolError
from protocols.kafka import records as r
from protocols.kafka.connection import (
    KafkaServerConnection,
    Request,
    UnsupportedRequest,
    decode_request,
    encode_response,
    encode_response_parts,
    frame,
)
from protocols.kafka.messages import CODECS, REQUESTS, request_header_version
from protocols.kafka.primitives import PART_MIN
from protocols.kafka.records import RequestHeader, encode_request_header
from tests.protocols.kafka.samples import random_record, versions_of

SEED = 0x4B61


def request_bytes(api_key: int, version: int, correlation_id: int, body: Any,
                  client_id: str | None = "test") -> bytes:
    """A whole request frame, as a client writes it."""
    header = encode_request_header(RequestHeader(api_key, version, correlation_id, client_id),
                                   request_header_version(api_key, version))
    return frame(header + REQUESTS[api_key].encode(body, version=version))


def random_requests(rng: random.Random, count: int) -> list[tuple[bytes, Request]]:
    out = []
    for i in range(count):
        api_key = rng.choice(sorted(REQUESTS))
        name = REQUESTS[api_key].name
        version = rng.choice(versions_of(name))
        body = random_record(name, version, rng)
        client = rng.choice([None, "", "rdkafka", "kafka-python-3"])
        out.append((request_bytes(api_key, version, i, body, client),
                    Request(api_key, version, i, client, body)))
    return out


def drain(conn: KafkaServerConnection) -> list[Any]:
    events = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA or event is CLOSED:
            return [*events, event]
        events.append(event)


def feed_in_pieces(stream: bytes, cuts: list[int]) -> list[Any]:
    conn = KafkaServerConnection()
    events: list[Any] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        conn.receive_data(stream[start:cut])
        start = cut
        events += [e for e in drain(conn) if e is not NEED_DATA]
    conn.receive_data(b"")
    events += drain(conn)
    return events


@pytest.mark.parametrize("how", ["whole", "byte by byte", "random splits"])
def test_three_way_feeding(how: str) -> None:
    rng = random.Random(SEED)
    pairs = random_requests(rng, 60)
    stream = b"".join(wire for wire, _ in pairs)
    if how == "whole":
        cuts: list[int] = []
    elif how == "byte by byte":
        cuts = list(range(1, len(stream)))
    else:
        cuts = sorted(rng.sample(range(1, len(stream)), 200))
    assert feed_in_pieces(stream, cuts) == [expected for _, expected in pairs] + [CLOSED]


def test_an_oversized_frame_is_refused_before_its_payload_arrives() -> None:
    conn = KafkaServerConnection(max_frame_size=1000)
    conn.receive_data(struct.pack(">i", 1001))
    with pytest.raises(FrameTooLarge):
        conn.next_event()
    assert conn.buffered == 4  # nothing of the payload was waited for
    with pytest.raises(ProtocolError, match="already failed"):
        conn.next_event()


def test_a_negative_size_is_refused() -> None:
    conn = KafkaServerConnection()
    conn.receive_data(struct.pack(">i", -1))
    with pytest.raises(FrameTooLarge):
        conn.next_event()


def test_a_frame_of_exactly_the_limit_passes() -> None:
    body = r.SaslAuthenticateRequest(b"x" * 100)
    wire = request_bytes(36, 0, 1, body)
    conn = KafkaServerConnection(max_frame_size=len(wire) - 4)
    conn.receive_data(wire)
    assert conn.next_event() == Request(36, 0, 1, "test", body)


def test_unsupported_versions_and_keys_are_events_not_errors() -> None:
    conn = KafkaServerConnection()
    # ApiVersions v4 (newer than declared): the body is not decoded, the header read.
    conn.receive_data(frame(struct.pack(">hhih", 18, 4, 77, 3) + b"cli" + b"\x00\xff\xfe"))
    conn.receive_data(frame(struct.pack(">hhih", 1, 13, 78, -1) + b"anything"))  # Fetch 13
    conn.receive_data(frame(struct.pack(">hhih", 999, 0, 79, 100)))  # unknown key, bad id
    conn.receive_data(request_bytes(18, 0, 80, r.ApiVersionsRequest()))
    assert drain(conn) == [UnsupportedRequest(18, 4, 77, "cli"),
                           UnsupportedRequest(1, 13, 78, None),
                           UnsupportedRequest(999, 0, 79, None),
                           Request(18, 0, 80, "test", r.ApiVersionsRequest()), NEED_DATA]


def test_the_answer_to_an_unsupported_api_versions_is_v0() -> None:
    conn = KafkaServerConnection()
    conn.receive_data(frame(struct.pack(">hhih", 18, 9, 5, -1)))
    event = conn.next_event()
    assert isinstance(event, UnsupportedRequest)
    answer = conn.send(event, r.ApiVersionsResponse(35, [r.ApiVersion(18, 0, 3)]), version=0)
    assert answer == frame(bytes.fromhex("00000005" "0023" "00000001" "0012" "0000" "0003"))


def test_responses_carry_the_header_version_of_their_request() -> None:
    conn = KafkaServerConnection()
    conn.receive_data(request_bytes(1, 12, 9, r.FetchRequest()))
    conn.receive_data(request_bytes(1, 11, 10, r.FetchRequest()))
    flexible, old = conn.next_event(), conn.next_event()
    assert conn.send(flexible, r.FetchResponse())[4:9] == bytes.fromhex("00000009" "00")
    assert conn.send(old, r.FetchResponse())[4:12] == bytes.fromhex("0000000a" "00000000")


def test_too_short_for_a_header() -> None:
    conn = KafkaServerConnection()
    conn.receive_data(frame(b"\x00\x03\x00"))
    with pytest.raises(ProtocolError, match="too short"):
        conn.next_event()


def test_eof_in_the_middle_of_a_frame_is_an_error() -> None:
    conn = KafkaServerConnection()
    conn.receive_data(request_bytes(18, 0, 1, r.ApiVersionsRequest())[:-1])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(ProtocolError, match="middle of a frame"):
        conn.next_event()


def _mutate(rng: random.Random, wire: bytes) -> bytes:
    data = bytearray(wire)
    choice = rng.randrange(6)
    if choice == 0 and len(data) > 4:
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(4, len(data))] = rng.randrange(256)
    elif choice == 1:
        del data[rng.randrange(4, max(5, len(data))):]
        data[:4] = struct.pack(">i", len(data) - 4)  # the length kept right
    elif choice == 2:
        data += rng.randbytes(rng.randrange(1, 20))
        data[:4] = struct.pack(">i", len(data) - 4)
    elif choice == 3:
        at = rng.randrange(4, max(5, len(data)))
        data[at:at] = rng.randbytes(rng.randrange(1, 5))
        if rng.random() < 0.5:
            data[:4] = struct.pack(">i", len(data) - 4)
    elif choice == 4 and len(data) >= 8:  # another version of the same API
        struct.pack_into(">h", data, 6, rng.randrange(0, 14))
    else:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def test_fuzz_raises_only_protocol_errors() -> None:
    rng = random.Random(SEED)
    valid = [wire for wire, _ in random_requests(rng, 300)]
    outcomes = {"event": 0, "error": 0}
    for i in range(6000):
        if i % 5 == 0:
            data = frame(rng.randbytes(rng.randrange(0, 64)))
        else:
            data = _mutate(rng, rng.choice(valid))
        conn = KafkaServerConnection(max_frame_size=1 << 16)
        conn.receive_data(data)
        conn.receive_data(b"")
        try:
            while conn.next_event() not in (NEED_DATA, CLOSED):
                outcomes["event"] += 1
        except ProtocolError:
            outcomes["error"] += 1
    assert outcomes["event"] > 500 and outcomes["error"] > 500, outcomes


def test_every_request_codec_is_reachable_by_key() -> None:
    assert {c.name for c in REQUESTS.values()} == {
        n for n, c in CODECS.items() if c.spec.kind == "request"}


def test_trailing_bytes_after_a_request_body_are_ignored_as_kafka_does() -> None:
    # Kafka's broker reads a request's declared fields off the frame and drops the rest.
    body = r.ApiVersionsRequest("c", "1")
    wire = request_bytes(18, 3, 1, body) + b"\x00\x07"
    conn = KafkaServerConnection()
    conn.receive_data(struct.pack(">i", len(wire) - 4) + wire[4:])
    assert conn.next_event() == Request(18, 3, 1, "test", body)
    # The next frame starts where the size said, not where the body ended.
    conn.receive_data(request_bytes(18, 3, 2, body))
    assert conn.next_event() == Request(18, 3, 2, "test", body)
    assert conn.next_event() is NEED_DATA


@pytest.mark.parametrize("version", [4, 11, 12])
def test_a_fetch_response_as_buffers_keeps_its_records_apart_without_a_copy(version: int
                                                                            ) -> None:
    rng = random.Random(SEED + version)
    big = bytearray(rng.randbytes(PART_MIN + 100))
    bigger = rng.randbytes(3 * PART_MIN)
    small = rng.randbytes(PART_MIN - 1)
    body = r.FetchResponse(throttle_time_ms=7, responses=[
        r.FetchableTopicResponse(topic="a", partitions=[
            r.PartitionData(partition_index=0, high_watermark=9, records=big),
            r.PartitionData(partition_index=1, high_watermark=9, records=small),
            r.PartitionData(partition_index=2, high_watermark=-1, records=None)]),
        r.FetchableTopicResponse(topic="b", partitions=[
            r.PartitionData(partition_index=0, high_watermark=3, records=bigger)])])
    pieces = encode_response_parts(1, version, 1234, body)
    # The same frame as the one-copy encoding, size included ...
    assert b"".join(pieces) == encode_response(1, version, 1234, body)
    # ... with the large records as pieces of their own (the very objects: not copied),
    # the small ones copied into the encoder's bytes.
    assert [i for i, piece in enumerate(pieces) if piece is big or piece is bigger] == [1, 3]
    assert len(pieces) == 5 and not any(small == piece for piece in pieces)


def test_a_response_without_large_records_is_one_buffer() -> None:
    conn = KafkaServerConnection()
    conn.receive_data(request_bytes(18, 3, 5, r.ApiVersionsRequest()))
    request = conn.next_event()
    body = r.ApiVersionsResponse(api_keys=[r.ApiVersion(0, 0, 9)])
    assert conn.send_parts(request, body) == [conn.send(request, body)]


def test_a_produce_request_s_records_are_a_view_of_the_payload_not_a_copy() -> None:
    records = random.Random(SEED).randbytes(50_000)
    body = r.ProduceRequest(acks=1, timeout_ms=100, topic_data=[
        r.TopicProduceData("t", [r.PartitionProduceData(0, records)])])
    for version in (3, 9):
        payload = request_bytes(0, version, 1, body)[4:]
        event = decode_request(payload)
        got = event.body.topic_data[0].partition_data[0].records
        assert isinstance(got, memoryview) and got.obj is payload and got == records
        # A mutable buffer is copied from (a view would pin it).
        mutable = bytearray(payload)
        _, pos = r.read_request_header(mutable, 0, len(mutable), 1 if version < 9 else 2)
        copied = r.read_produce_request(mutable, pos, len(mutable), version)[0]
        kept = copied.topic_data[0].partition_data[0].records
        assert not isinstance(kept, memoryview) and kept == records
