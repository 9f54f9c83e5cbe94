"""Tank messages and connection: golden bytes, three-way feeding, round trips, matching.

Every expected byte string here is written out by hand from the layouts in
``protocol-facts.md`` (and TANK's source for the clustered variants and ConsumePeer), with
``struct.pack`` and the local helpers below: none of it comes from the codec under test.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.connection import CLOSED, NEED_DATA, Role
from protocols.errors import FrameTooLarge, ProtocolError
from protocols.tank.connection import Reply, TankConnection, encode_consume_response_head
from protocols.tank.messages import (
    CODECS,
    ClusterNode,
    ClusterTopology,
    ConsumeFlags,
    ConsumePartition,
    ConsumePartitionResult,
    ConsumePeerPartition,
    ConsumePeerRequest,
    ConsumePeerResponse,
    ConsumePeerTopic,
    ConsumeRequest,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    CreateTopicRequest,
    CreateTopicResponse,
    DiscoveredPartition,
    DiscoveredTopic,
    DiscoverPartitionsRequest,
    DiscoverPartitionsResponse,
    DiscoverTopicsRequest,
    DiscoverTopicsResponse,
    DiscoverTopologyRequest,
    DiscoverTopologyResponse,
    Endpoint,
    MsgId,
    Ping,
    ProduceError,
    ProducePartition,
    ProducePartitionResult,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResult,
    ProduceWithSeqnumPartition,
    ProduceWithSeqnumRequest,
    ProduceWithSeqnumTopic,
    RegReplicaRequest,
    ReloadConfRequest,
    ReloadConfResponse,
    StatusCluster,
    StatusRequest,
    StatusResponse,
    decode_produce_request,
    decode_response,
)

U64_MAX = (1 << 64) - 1


# -- independent byte builders -----------------------------------------------------------------

def u8(v: int) -> bytes:
    return struct.pack("<B", v)


def u16(v: int) -> bytes:
    return struct.pack("<H", v)


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def s8(text: str) -> bytes:
    raw = text.encode()
    return u8(len(raw)) + raw


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def frame(msg_id: int, payload: bytes) -> bytes:
    return u8(msg_id) + u32(len(payload)) + payload


def test_varint_helper_matches_the_facts() -> None:
    assert varint(209) == bytes.fromhex("d101")
    assert varint(8196) == bytes.fromhex("8440")


# -- golden cases --------------------------------------------------------------------------------

@dataclass
class Golden:
    """One message: its msgId, hand-built payload, record, and (responses) its request."""

    name: str
    msg_id: int
    record: Any
    payload: bytes = b""
    request: Any = None

    @property
    def frame(self) -> bytes:
        return frame(self.msg_id, self.payload)


# A real one-message plain bundle: flags (count 1 << 2) | msg flags 0 | u64 ts | varint len | value.
BUNDLE_HELLO = b"\x04" + b"\x00" + u64(1_700_000_000_000) + varint(5) + b"hello"
BUNDLE_200 = bytes(range(200))
CONFIG = b"log.retention.secs=86400\nlog.segment.bytes=1073741824\n" * 3
CHUNK_A = varint(len(BUNDLE_HELLO)) + BUNDLE_HELLO
CHUNK_B = b"\x09" + b"\x44partial"  # a partial last bundle: clients must accept it

PRODUCE = ProduceRequest(
    client_version=2, request_id=0x01020304, client_id="c++", required_acks=1,
    ack_timeout_ms=5000, topics=[
        ProduceTopic("orders", [ProducePartition(0, BUNDLE_HELLO), ProducePartition(3, b"")]),
        ProduceTopic("logs", [ProducePartition(1, BUNDLE_200)]),
    ])
PRODUCE_WITH_SEQNUM = ProduceWithSeqnumRequest(
    client_version=2, request_id=9, client_id="mirror", required_acks=0, ack_timeout_ms=0,
    topics=[ProduceWithSeqnumTopic("orders", [ProduceWithSeqnumPartition(0, 1000, BUNDLE_HELLO)])])
CONSUME_V2 = ConsumeRequest(
    client_version=2, request_id=77, client_id="", max_wait_ms=1000, min_bytes=0,
    topics=[ConsumeTopic("orders", [ConsumePartition(0, 0, 65536),
                                    ConsumePartition(1, U64_MAX, 1024)])])
CONSUME_V3 = ConsumeRequest(
    client_version=3, request_id=78, client_id="py", max_wait_ms=50, min_bytes=128, flags=1,
    topics=[ConsumeTopic("t", [ConsumePartition(4, 12, 4096)])])
CONSUME_PEER = ConsumePeerRequest(
    replica_id=2, max_wait_ms=500, min_bytes=1, topics=[
        ConsumePeerTopic("orders", [ConsumePeerPartition(0, 10, 1 << 20),
                                    ConsumePeerPartition(1, 11, 4096)])])

GOLDEN_REQUESTS = [
    Golden("produce", 0x01, PRODUCE, payload=(
        u16(2) + u32(0x01020304) + s8("c++") + u8(1) + u32(5000) + u8(2)
        + s8("orders") + u8(2)
        + u16(0) + varint(len(BUNDLE_HELLO)) + BUNDLE_HELLO
        + u16(3) + b"\x00"
        + s8("logs") + u8(1) + u16(1) + b"\xc8\x01" + BUNDLE_200)),
    Golden("produce_with_seqnum", 0x05, PRODUCE_WITH_SEQNUM, payload=(
        u16(2) + u32(9) + s8("mirror") + u8(0) + u32(0) + u8(1) + s8("orders") + u8(1)
        + u16(0) + varint(len(BUNDLE_HELLO)) + u64(1000) + BUNDLE_HELLO)),
    Golden("consume_v2", 0x02, CONSUME_V2, payload=(
        u16(2) + u32(77) + s8("") + u64(1000) + u32(0) + u8(1) + s8("orders") + u8(2)
        + u16(0) + u64(0) + u32(65536) + u16(1) + u64(U64_MAX) + u32(1024))),
    Golden("consume_v3_flags", 0x02, CONSUME_V3, payload=(
        u16(3) + u32(78) + s8("py") + u64(50) + u32(128) + u8(1) + u8(1) + s8("t") + u8(1)
        + u16(4) + u64(12) + u32(4096))),
    Golden("ping", 0x03, Ping(), payload=b""),
    Golden("reg_replica", 0x04, RegReplicaRequest(7), payload=u16(7)),
    Golden("discover_partitions_all", 0x06, DiscoverPartitionsRequest(5, "orders", []),
           payload=u32(5) + s8("orders")),
    Golden("discover_partitions_listed", 0x06,
           DiscoverPartitionsRequest(6, "orders", [0, 2, 513]),
           payload=u32(6) + s8("orders") + u16(0) + u16(2) + u16(513)),
    Golden("create_topic", 0x07, CreateTopicRequest(8, "metrics", 16, CONFIG),
           payload=u32(8) + s8("metrics") + u16(16) + varint(len(CONFIG)) + CONFIG),
    Golden("reload_conf", 0x08, ReloadConfRequest(9, "orders", 3),
           payload=u32(9) + s8("orders") + u16(3)),
    Golden("consume_peer", 0x09, CONSUME_PEER, payload=(
        u16(2) + u64(500) + u32(1) + u16(1) + s8("orders") + u16(2)
        + u16(0) + u64(10) + u32(1 << 20) + u16(1) + u64(11) + u32(4096))),
    Golden("status", 0x0A, StatusRequest(10), payload=u32(10)),
    Golden("discover_topics", 0x0B, DiscoverTopicsRequest(11, 0), payload=u32(11) + u8(0)),
    Golden("discover_topology", 0x0C, DiscoverTopologyRequest(12, 0),
           payload=u32(12) + u8(0)),
]

PRODUCE_MIXED = ProduceRequest(2, 21, "c++", 0, 0, [
    ProduceTopic("orders", [ProducePartition(0, BUNDLE_HELLO), ProducePartition(3, BUNDLE_HELLO)]),
    ProduceTopic("logs", [ProducePartition(1, BUNDLE_HELLO)]),
    ProduceTopic("nope", [ProducePartition(p, BUNDLE_HELLO) for p in range(3)]),
])
PRODUCE_SEVEN = ProduceRequest(2, 22, "", 0, 0, [
    ProduceTopic("t", [ProducePartition(p, b"") for p in range(7)])])
PRODUCE_CODES = [ProduceError.OK, ProduceError.UNKNOWN_PARTITION, ProduceError.IO_FAULT,
                 ProduceError.ACK_TIMEOUT, ProduceError.INSUFFICIENT_REPLICAS,
                 ProduceError.INVALID_SEQUENCE, ProduceError.NO_LEADER]
PRODUCE_READ_ONLY = ProduceRequest(2, 23, "", 0, 0, [
    ProduceTopic("a", [ProducePartition(0, b""), ProducePartition(1, b"")]),
    ProduceTopic("b", [ProducePartition(5, b"")])])
PRODUCE_EMPTY_TOPIC = ProduceRequest(2, 24, "", 0, 0, [
    ProduceTopic("empty", []), ProduceTopic("t", [ProducePartition(0, b"")])])
SEQNUM_25 = ProduceWithSeqnumRequest(2, 25, "", 0, 0, [
    ProduceWithSeqnumTopic("orders", [ProduceWithSeqnumPartition(0, 5, BUNDLE_HELLO)])])
CONSUME_31 = ConsumeRequest(2, 31, "", 100, 0, topics=[
    ConsumeTopic("orders", [ConsumePartition(p, 100, 4096) for p in range(7)]),
    ConsumeTopic("ghost", [ConsumePartition(0, 0, 10), ConsumePartition(1, 0, 10)]),
    ConsumeTopic("logs", [ConsumePartition(0, 2, 10)])])

CONSUME_HEADER = (
    u32(31) + u8(3)
    + s8("orders") + u8(7)
    + u16(0) + u8(0x00) + u64(100) + u64(250) + u32(len(CHUNK_A))
    + u16(1) + u8(0xFE) + u64(250) + u32(len(CHUNK_B))
    + u16(2) + u8(0x01) + u64(0) + u64(250) + u32(0) + u64(90)
    + u16(3) + u8(0xFF)
    + u16(4) + u8(0xFB)
    + u16(5) + u8(0xFC) + bytes([192, 168, 1, 20]) + u16(11011)
    + u16(6) + u8(0xFD)
    + s8("ghost") + u8(2) + u16(0xFFFF)
    + s8("logs") + u8(1)
    + u16(0) + u8(0x00) + u64(1) + u64(1) + u32(0))
CONSUME_RESPONSE = ConsumeResponse(31, [
    ConsumeTopicResult("orders", [
        ConsumePartitionResult(0, ConsumeFlags.OK, 100, 250, len(CHUNK_A), chunk=CHUNK_A),
        ConsumePartitionResult(1, ConsumeFlags.SPARSE_FIRST_BUNDLE, 0, 250, len(CHUNK_B),
                               chunk=CHUNK_B),
        ConsumePartitionResult(2, ConsumeFlags.BOUNDARY_CHECK, 0, 250, 0, 90),
        ConsumePartitionResult(3, ConsumeFlags.UNKNOWN_PARTITION),
        ConsumePartitionResult(4, ConsumeFlags.SYSTEM_FAULT),
        ConsumePartitionResult(5, ConsumeFlags.OTHER_LEADER,
                               leader=Endpoint("192.168.1.20", 11011)),
        ConsumePartitionResult(6, ConsumeFlags.NO_LEADER),
    ]),
    ConsumeTopicResult("ghost", [], unknown=True, requested_partitions=2),
    ConsumeTopicResult("logs", [ConsumePartitionResult(0, ConsumeFlags.OK, 1, 1, 0, chunk=b"")]),
])
CONSUME_PEER_HEADER = (
    u16(2)
    + s8("orders") + u16(1) + u16(0) + u8(0) + u64(10) + u64(12) + u32(len(CHUNK_A))
    + s8("gone") + u16(3) + u16(0xFFFF))
CONSUME_PEER_RESPONSE = ConsumePeerResponse([
    ConsumeTopicResult("orders", [ConsumePartitionResult(0, 0, 10, 12, len(CHUNK_A),
                                                         chunk=CHUNK_A)]),
    ConsumeTopicResult("gone", [], unknown=True, requested_partitions=3),
])


def _result(name: str, codes: list[tuple[int, int]]) -> ProduceTopicResult:
    return ProduceTopicResult(name, [ProducePartitionResult(p, c) for p, c in codes])


GOLDEN_RESPONSES = [
    Golden("produce_mixed", 0x01, ProduceResponse(21, [
        ProduceTopicResult("orders", [
            ProducePartitionResult(0, ProduceError.OK),
            ProducePartitionResult(3, ProduceError.OTHER_LEADER, Endpoint("10.0.0.7", 11011))]),
        _result("logs", [(1, ProduceError.INVALID_SEQUENCE)]),
        _result("nope", [(p, ProduceError.UNKNOWN_TOPIC) for p in range(3)]),
    ]), request=PRODUCE_MIXED, payload=(
        u32(21) + u8(0x00) + u8(0xFC) + bytes([10, 0, 0, 7]) + u16(11011) + u8(0x0A)
        + u8(0xFF))),
    Golden("produce_every_code", 0x01, ProduceResponse(22, [
        _result("t", list(enumerate(PRODUCE_CODES)))]),
        request=PRODUCE_SEVEN, payload=u32(22) + bytes([0, 1, 2, 3, 4, 10, 0xFD])),
    Golden("produce_read_only", 0x01, ProduceResponse(23, [
        _result("a", [(0, ProduceError.READ_ONLY), (1, ProduceError.READ_ONLY)]),
        _result("b", [(5, ProduceError.READ_ONLY)])]),
        request=PRODUCE_READ_ONLY, payload=u32(23) + b"\xfe\xfe"),
    Golden("produce_topic_without_partitions", 0x01, ProduceResponse(24, [
        ProduceTopicResult("empty", []), _result("t", [(0, ProduceError.OK)])]),
        request=PRODUCE_EMPTY_TOPIC, payload=u32(24) + b"\x00"),
    Golden("produce_with_seqnum_answer", 0x01, ProduceResponse(25, [
        _result("orders", [(0, ProduceError.INVALID_SEQUENCE)])]),
        request=SEQNUM_25, payload=u32(25) + b"\x0a"),
    Golden("consume_every_variant", 0x02, CONSUME_RESPONSE, request=CONSUME_31,
           payload=u32(len(CONSUME_HEADER)) + CONSUME_HEADER + CHUNK_A + CHUNK_B),
    Golden("discover_partitions", 0x06, DiscoverPartitionsResponse(41, "orders", [
        DiscoveredPartition(1, 500),
        DiscoveredPartition(error=ConsumeFlags.SYSTEM_FAULT),
        DiscoveredPartition(error=ConsumeFlags.OTHER_LEADER, leader=Endpoint("10.0.0.9", 11011)),
    ]), request=DiscoverPartitionsRequest(41, "orders", []), payload=(
        u32(41) + s8("orders") + u16(3) + u64(1) + u64(500)
        + u64(U64_MAX) + u64(U64_MAX) + u8(0xFB)
        + u64(U64_MAX) + u64(U64_MAX) + u8(0xFC) + bytes([10, 0, 0, 9]) + u16(11011))),
    Golden("discover_partitions_unknown_topic", 0x06, DiscoverPartitionsResponse(42, "nope", []),
           request=DiscoverPartitionsRequest(42, "nope", []),
           payload=u32(42) + s8("nope") + u16(0)),
    Golden("create_topic", 0x07, CreateTopicResponse(43, "metrics", 1),
           request=CreateTopicRequest(43, "metrics", 4, b""),
           payload=u32(43) + s8("metrics") + u8(1)),
    Golden("reload_conf", 0x08, ReloadConfResponse(44, "orders", 3, 11),
           request=ReloadConfRequest(44, "orders", 3),
           payload=u32(44) + s8("orders") + u16(3) + u8(11)),
    Golden("status", 0x0A, StatusResponse(45, 0, 0, 3, 24, None, 24, 1500, 1_700_000_000, 306),
           request=StatusRequest(45), payload=(
               u32(45) + u8(0) + u8(0) + u32(3) + u32(24) + u32(24) + u32(1500)
               + u32(1_700_000_000) + u32(306))),
    Golden("status_clustered", 0x0A, StatusResponse(
        46, 0, 1, 3, 24, StatusCluster(0, "prod", 3), 24, 1500, 1_700_000_000, 306),
        request=StatusRequest(46), payload=(
            u32(46) + u8(0) + u8(1) + u32(3) + u32(24) + u8(0) + s8("prod") + u32(3)
            + u32(24) + u32(1500) + u32(1_700_000_000) + u32(306))),
    Golden("discover_topics", 0x0B, DiscoverTopicsResponse(47, [
        DiscoveredTopic("orders", True, 8), DiscoveredTopic("logs", False, 1)]),
        request=DiscoverTopicsRequest(47, 0), payload=(
            u32(47) + u32(2) + u8(0) + s8("orders") + u8(1) + u16(8)
            + s8("logs") + u8(0) + u16(1))),
    Golden("discover_topics_clustered", 0x0B, DiscoverTopicsResponse(48, [
        DiscoveredTopic("orders", True, 8, 3)]),
        request=DiscoverTopicsRequest(48, 0),
        payload=u32(48) + u32(1) + u8(1) + s8("orders") + u8(1) + u16(8) + u8(3)),
    Golden("discover_topology", 0x0C, DiscoverTopologyResponse(49, None),
           request=DiscoverTopologyRequest(49, 0), payload=u32(49) + u16(0xFFFF)),
    Golden("discover_topology_clustered", 0x0C, DiscoverTopologyResponse(50, ClusterTopology(
        "prod", [ClusterNode(1, 3, Endpoint("10.0.0.1", 11011), 12), ClusterNode(2, 2, None, 0)])),
        request=DiscoverTopologyRequest(50, 0), payload=(
            u32(50) + u16(2) + s8("prod")
            + u16(1) + u8(3) + bytes([10, 0, 0, 1]) + u16(11011) + u16(12)
            + u16(2) + u8(2) + u16(0))),
    Golden("consume_peer", 0x09, CONSUME_PEER_RESPONSE, request=CONSUME_PEER,
           payload=u32(len(CONSUME_PEER_HEADER)) + CONSUME_PEER_HEADER + CHUNK_A),
]

PING_FRAME = bytes.fromhex("0300000000")


def test_status_response_is_30_bytes_standalone() -> None:
    status = next(g for g in GOLDEN_RESPONSES if g.name == "status")
    assert len(status.payload) == 30


# -- feeding -------------------------------------------------------------------------------------

def drain(conn: TankConnection) -> list[Any]:
    events = []
    while (event := conn.next_event()) is not NEED_DATA:
        assert event is not CLOSED
        events.append(event)
    return events


def feed(conn: TankConnection, data: bytes, mode: str) -> list[Any]:
    """Feed ``data`` whole, byte by byte, or followed by a Ping and most of another copy."""
    if mode == "whole":
        conn.receive_data(data)
        return drain(conn)
    if mode == "bytewise":
        events = []
        for i in range(len(data)):
            conn.receive_data(data[i:i + 1])
            events += drain(conn)
        return events
    assert mode == "trailing"
    conn.receive_data(data + PING_FRAME + data[:-1])
    events = drain(conn)
    assert events[-1] == Ping()
    return events[:-1]


MODES = ["whole", "bytewise", "trailing"]


def client_expecting(request: Any) -> TankConnection:
    client = TankConnection(Role.CLIENT)
    client.send(request)
    return client


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("golden", GOLDEN_REQUESTS, ids=lambda g: g.name)
def test_server_decodes_golden_requests(golden: Golden, mode: str) -> None:
    assert feed(TankConnection(Role.SERVER), golden.frame, mode) == [golden.record]


@pytest.mark.parametrize("golden", GOLDEN_REQUESTS, ids=lambda g: g.name)
def test_client_encodes_golden_requests(golden: Golden) -> None:
    assert TankConnection(Role.CLIENT).send(golden.record) == golden.frame


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("golden", GOLDEN_RESPONSES, ids=lambda g: g.name)
def test_client_decodes_golden_responses(golden: Golden, mode: str) -> None:
    client = client_expecting(golden.request)
    assert feed(client, golden.frame, mode) == [Reply(golden.request, golden.record)]
    assert not client.pending


@pytest.mark.parametrize("golden", GOLDEN_RESPONSES, ids=lambda g: g.name)
def test_server_encodes_golden_responses(golden: Golden) -> None:
    assert TankConnection(Role.SERVER).send(golden.record) == golden.frame


@pytest.mark.parametrize("role", list(Role))
def test_ping_both_ways(role: Role) -> None:
    conn = TankConnection(role)
    assert conn.send(Ping()) == PING_FRAME
    for mode in MODES:
        assert feed(TankConnection(role), PING_FRAME, mode) == [Ping()]


def test_ping_payload_must_be_empty() -> None:
    conn = TankConnection(Role.CLIENT)
    conn.receive_data(frame(0x03, b"\x00"))
    with pytest.raises(ProtocolError):
        conn.next_event()


# -- Produce and Consume specifics ---------------------------------------------------------------

def test_produce_with_seqnum_is_answered_as_produce() -> None:
    client = TankConnection(Role.CLIENT)
    assert client.send(SEQNUM_25)[0] == MsgId.PRODUCE_WITH_SEQNUM
    response = ProduceResponse(25, [_result("orders", [(0, ProduceError.OK)])])
    data = TankConnection(Role.SERVER).send(response)
    assert data == frame(0x01, u32(25) + b"\x00")
    client.receive_data(data)
    assert client.next_event() == Reply(SEQNUM_25, response)


def test_produce_response_needs_its_request() -> None:
    with pytest.raises(ValueError, match="request"):
        decode_response(MsgId.PRODUCE, u32(1) + b"\x00")


@pytest.mark.parametrize("payload", [
    u32(21) + b"\x00",  # codes missing for two topics
    u32(21) + b"\x00\xfc\x0a\x00",  # endpoint cut short
    u32(21) + b"\x00\x00\x00\xff\x00",  # one byte too many
], ids=["short", "endpoint", "trailing"])
def test_produce_response_must_match_the_request(payload: bytes) -> None:
    client = client_expecting(PRODUCE_MIXED)
    client.receive_data(frame(0x01, payload))
    with pytest.raises(ProtocolError):
        client.next_event()


def test_produce_response_topic_wide_code_covers_every_partition() -> None:
    server = TankConnection(Role.SERVER)
    mixed = ProduceResponse(23, [ProduceTopicResult("a", [
        ProducePartitionResult(0, ProduceError.READ_ONLY), ProducePartitionResult(1, 0)])])
    with pytest.raises(ValueError, match="whole topic"):
        server.send(mixed)
    leaderless = ProduceResponse(1, [_result("a", [(0, ProduceError.OTHER_LEADER)])])
    with pytest.raises(ValueError, match="leader"):
        server.send(leaderless)


def test_consume_head_then_chunks_equals_the_whole_frame() -> None:
    whole = TankConnection(Role.SERVER).send(CONSUME_RESPONSE)
    head = encode_consume_response_head(CONSUME_RESPONSE)
    assert whole == head + CHUNK_A + CHUNK_B
    # The listener's case: lengths only, no chunk bytes in memory.
    lengths_only = ConsumeResponse(31, [
        ConsumeTopicResult(t.name, [
            ConsumePartitionResult(p.partition, p.flags, p.base_seq_num, p.high_water_mark,
                                   p.chunk_length, p.first_available_seq_num, p.leader)
            for p in t.partitions], t.unknown, t.requested_partitions)
        for t in CONSUME_RESPONSE.topics])
    assert encode_consume_response_head(lengths_only) == head
    with pytest.raises(ValueError, match="chunk"):
        TankConnection(Role.SERVER).send(lengths_only)
    peer_head = encode_consume_response_head(CONSUME_PEER_RESPONSE)
    assert peer_head + CHUNK_A == TankConnection(Role.SERVER).send(CONSUME_PEER_RESPONSE)


def test_consume_chunk_length_must_agree_with_the_chunk() -> None:
    bad = ConsumeResponse(1, [ConsumeTopicResult("t", [
        ConsumePartitionResult(0, 0, 1, 1, chunk_length=3, chunk=b"ab")])])
    with pytest.raises(ValueError, match="chunk_length"):
        encode_consume_response_head(bad)


@pytest.mark.parametrize("payload", [
    u32(200) + u32(1) + u8(0),  # header length past the payload
    u32(6) + u32(1) + u8(0) + b"\x00",  # header length longer than the topics
    u32(4) + u32(1) + u8(0),  # header length shorter than the header
    u32(5) + u32(1) + u8(0) + b"\x00",  # a byte after the (empty) chunks
    (lambda h: u32(len(h)) + h + b"xy")(  # chunk announced 3 bytes, 2 present
        u32(1) + u8(1) + s8("t") + u8(1) + u16(0) + u8(0) + u64(1) + u64(1) + u32(3)),
    (lambda h: u32(len(h)) + h)(  # boundary error carrying a chunk length
        u32(1) + u8(1) + s8("t") + u8(1) + u16(0) + u8(1) + u64(0) + u64(1) + u32(1) + u64(1)),
    (lambda h: u32(len(h)) + h)(u32(1) + u8(1) + s8("t") + u8(1) + u16(0) + u8(0x42)),
    (lambda h: u32(len(h)) + h)(u32(1) + u8(1) + u8(2) + b"\xff\xfe" + u8(0)),
    u32(2) + b"\x01",
], ids=["header-past-end", "header-too-long", "header-too-short", "trailing", "chunk-overrun",
        "boundary-chunk", "unknown-flags", "name-not-utf8", "tiny"])
def test_malformed_consume_responses(payload: bytes) -> None:
    client = client_expecting(ConsumeRequest(2, 1, "", 0, 0, topics=[]))
    client.receive_data(frame(0x02, payload))
    with pytest.raises(ProtocolError):
        client.next_event()


def test_bundles_from_the_bundle_codec_travel_untouched() -> None:
    bundle_codec = pytest.importorskip("protocols.tank.bundle")
    bundle = bundle_codec.encode_bundle([bundle_codec.Message(value=b"v" * 3000)])
    request = ProduceRequest(2, 1, "", 0, 0, [ProduceTopic("t", [ProducePartition(0, bundle)])])
    server = TankConnection(Role.SERVER)
    server.receive_data(TankConnection(Role.CLIENT).send(request))
    assert server.next_event().topics[0].partitions[0].bundle == bundle


# -- request/response matching -------------------------------------------------------------------

def test_out_of_order_responses_are_matched_by_request_id() -> None:
    client = TankConnection(Role.CLIENT)
    consume = ConsumeRequest(2, 1, "", 5000, 0, topics=[])
    produce = ProduceRequest(2, 2, "", 0, 0, [ProduceTopic("t", [ProducePartition(0, b"x")])])
    status = StatusRequest(3)
    for request in (consume, produce, status):
        client.send(request)
    assert set(client.pending) == {1, 2, 3}
    server = TankConnection(Role.SERVER)
    status_resp = StatusResponse(3, 0, 0, 1, 1, None, 1, 2, 3, 306)
    produce_resp = ProduceResponse(2, [_result("t", [(0, ProduceError.OK)])])
    consume_resp = ConsumeResponse(1, [])
    client.receive_data(b"".join(server.send(r) for r in (status_resp, produce_resp,
                                                          consume_resp)))
    assert drain(client) == [Reply(status, status_resp), Reply(produce, produce_resp),
                             Reply(consume, consume_resp)]
    assert not client.pending


def test_response_to_an_unknown_request_id_is_a_protocol_error() -> None:
    client = client_expecting(StatusRequest(1))
    client.receive_data(frame(0x0A, u32(2) + bytes(26)))
    with pytest.raises(ProtocolError, match="unknown request id"):
        client.next_event()


def test_response_of_the_wrong_kind_is_a_protocol_error() -> None:
    client = client_expecting(StatusRequest(5))
    client.receive_data(frame(0x0B, u32(5) + u32(0) + u8(0)))
    with pytest.raises(ProtocolError, match="StatusRequest"):
        client.next_event()


def test_pending_request_ids_must_be_unique() -> None:
    client = client_expecting(StatusRequest(5))
    with pytest.raises(ValueError, match="already pending"):
        client.send(DiscoverTopicsRequest(5, 0))


def test_each_role_sends_only_its_own_side() -> None:
    with pytest.raises(TypeError):
        TankConnection(Role.SERVER).send(StatusRequest(1))
    with pytest.raises(TypeError):
        TankConnection(Role.CLIENT).send(StatusResponse(1))
    with pytest.raises(TypeError):
        TankConnection(Role.CLIENT).send(object())


def test_requests_without_an_answer_are_not_pending() -> None:
    client = TankConnection(Role.CLIENT)
    client.send(Ping())
    client.send(RegReplicaRequest(1))
    assert not client.pending


def test_consume_peer_responses_are_matched_in_order() -> None:
    client = TankConnection(Role.CLIENT)
    first = ConsumePeerRequest(1, 0, 0, [])
    second = ConsumePeerRequest(2, 0, 0, [])
    client.send(first)
    client.send(second)
    server = TankConnection(Role.SERVER)
    empty = ConsumePeerResponse([])
    client.receive_data(server.send(empty) * 2)
    assert drain(client) == [Reply(first, empty), Reply(second, empty)]
    client.receive_data(server.send(empty))
    with pytest.raises(ProtocolError, match="without a pending request"):
        client.next_event()


# -- framing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("msg_id", [0x00, 0x0D, 0xFF])
def test_unknown_msg_id_is_a_protocol_error(role: Role, msg_id: int) -> None:
    conn = TankConnection(role)
    conn.receive_data(frame(msg_id, u32(1)))
    with pytest.raises(ProtocolError, match="msgId"):
        conn.next_event()


@pytest.mark.parametrize("msg_id", [0x04, 0x05])
def test_no_broker_answers_with_reg_replica_or_seqnum(msg_id: int) -> None:
    conn = TankConnection(Role.CLIENT)
    conn.receive_data(frame(msg_id, u32(1)))
    with pytest.raises(ProtocolError, match="msgId"):
        conn.next_event()


@pytest.mark.parametrize("role", list(Role))
def test_oversized_frame_fails_before_its_payload_arrives(role: Role) -> None:
    conn = TankConnection(role, max_frame_size=1024)
    conn.receive_data(u8(0x01) + u32(1025))
    with pytest.raises(FrameTooLarge):
        conn.next_event()


def test_frame_at_the_limit_is_accepted() -> None:
    conn = TankConnection(Role.SERVER, max_frame_size=7)
    conn.receive_data(frame(0x0B, u32(1) + u8(0)) + frame(0x0A, u32(1) + u32(0)))
    assert conn.next_event() == DiscoverTopicsRequest(1, 0)
    with pytest.raises(FrameTooLarge):
        conn.next_event()


@pytest.mark.parametrize("role", list(Role))
def test_eof_mid_frame_is_a_protocol_error(role: Role) -> None:
    conn = TankConnection(role)
    conn.receive_data(PING_FRAME + frame(0x0A, u32(1))[:-1])
    assert conn.next_event() == Ping()
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(ProtocolError, match="middle of a frame"):
        conn.next_event()
    with pytest.raises(ProtocolError, match="already failed"):
        conn.next_event()


@pytest.mark.parametrize("role", list(Role))
def test_clean_eof_gives_closed(role: Role) -> None:
    conn = TankConnection(role)
    conn.receive_data(PING_FRAME)
    conn.receive_data(b"")
    assert conn.next_event() == Ping()
    assert conn.next_event() is CLOSED
    assert conn.next_event() is CLOSED


def test_truncated_request_is_a_protocol_error() -> None:
    produce = GOLDEN_REQUESTS[0]
    conn = TankConnection(Role.SERVER)
    conn.receive_data(frame(0x01, produce.payload[:-1]))
    with pytest.raises(ProtocolError):
        conn.next_event()


# -- hypothesis round trips ----------------------------------------------------------------------

u8s = st.integers(0, 0xFF)
u16s = st.integers(0, 0xFFFF)
u32s = st.integers(0, 0xFFFF_FFFF)
u64s = st.integers(0, U64_MAX)
names = st.text(max_size=12)
blobs = st.binary(max_size=40)
endpoints = st.builds(Endpoint, st.ip_addresses(v=4).map(str), u16s)


def small_lists(elements: st.SearchStrategy[Any], max_size: int = 3) -> st.SearchStrategy[list]:
    return st.lists(elements, max_size=max_size)


produce_requests = st.builds(
    ProduceRequest, u16s, u32s, names, u8s, u32s,
    small_lists(st.builds(ProduceTopic, names, small_lists(st.builds(ProducePartition, u16s,
                                                                     blobs)))))
seqnum_requests = st.builds(
    ProduceWithSeqnumRequest, u16s, u32s, names, u8s, u32s,
    small_lists(st.builds(ProduceWithSeqnumTopic, names, small_lists(
        st.builds(ProduceWithSeqnumPartition, u16s, u64s, blobs)))))


@st.composite
def consume_requests(draw: st.DrawFn) -> Any:
    version = draw(u16s)
    flags = draw(u8s) if version >= 3 else 0  # the field exists from version 3 on
    topics = draw(small_lists(st.builds(ConsumeTopic, names, small_lists(
        st.builds(ConsumePartition, u16s, u64s, u32s)))))
    return ConsumeRequest(version, draw(u32s), draw(names), draw(u64s), draw(u32s), flags,
                          topics)


REQUEST_STRATEGIES = {
    "produce": produce_requests,
    "produce_with_seqnum": seqnum_requests,
    "consume": consume_requests(),
    "ping": st.just(Ping()),
    "reg_replica": st.builds(RegReplicaRequest, u16s),
    "discover_partitions": st.builds(DiscoverPartitionsRequest, u32s, names,
                                     small_lists(u16s, 6)),
    "create_topic": st.builds(CreateTopicRequest, u32s, names, u16s, st.binary(max_size=300)),
    "reload_conf": st.builds(ReloadConfRequest, u32s, names, u16s),
    "consume_peer": st.builds(ConsumePeerRequest, u16s, u64s, u32s, small_lists(
        st.builds(ConsumePeerTopic, names, small_lists(
            st.builds(ConsumePeerPartition, u16s, u64s, u32s))))),
    "status": st.builds(StatusRequest, u32s),
    "discover_topics": st.builds(DiscoverTopicsRequest, u32s, u8s),
    "discover_topology": st.builds(DiscoverTopologyRequest, u32s, u8s),
}


def test_every_request_has_a_strategy() -> None:
    declared = {c.record for c in CODECS.values() if c.spec.kind == "request"}
    assert len(REQUEST_STRATEGIES) == len(declared) == len(MsgId)


@pytest.mark.parametrize("name", sorted(REQUEST_STRATEGIES))
@given(data=st.data())
def test_requests_round_trip(name: str, data: st.DataObject) -> None:
    request = data.draw(REQUEST_STRATEGIES[name])
    server = TankConnection(Role.SERVER)
    server.receive_data(TankConnection(Role.CLIENT).send(request))
    assert drain(server) == [request]


@given(produce_requests)
def test_fast_produce_decoder_matches_the_declaration(request: Any) -> None:
    payload = CODECS["ProduceRequest"].encode(request)
    assert decode_produce_request(payload) == CODECS["ProduceRequest"].decode(payload) == request


@st.composite
def produce_exchanges(draw: st.DrawFn) -> tuple[Any, Any]:
    request = draw(st.one_of(produce_requests, seqnum_requests))
    topics = []
    for topic in request.topics:
        wide = draw(st.sampled_from([None, ProduceError.UNKNOWN_TOPIC, ProduceError.READ_ONLY]))
        results = []
        for i, part in enumerate(topic.partitions):
            if wide is not None:
                code = wide
            else:
                choices = [c for c in ProduceError if i or c not in (0xFE, 0xFF)]
                code = draw(st.sampled_from(choices))
            leader = draw(endpoints) if code == ProduceError.OTHER_LEADER else None
            results.append(ProducePartitionResult(part.partition, code, leader))
        topics.append(ProduceTopicResult(topic.name, results))
    return request, ProduceResponse(request.request_id, topics)


@st.composite
def consume_results(draw: st.DrawFn) -> ConsumePartitionResult:
    # 0xFFFF as a topic's first partition id would read as the unknown-topic sentinel.
    partition = draw(st.integers(0, 0xFFFE))
    flags = draw(st.sampled_from(ConsumeFlags))
    if flags in (ConsumeFlags.OK, ConsumeFlags.SPARSE_FIRST_BUNDLE):
        chunk = draw(blobs)
        base = draw(u64s) if flags == ConsumeFlags.OK else 0
        return ConsumePartitionResult(partition, flags, base, draw(u64s), len(chunk), chunk=chunk)
    if flags == ConsumeFlags.BOUNDARY_CHECK:
        return ConsumePartitionResult(partition, flags, 0, draw(u64s), 0, draw(u64s))
    if flags == ConsumeFlags.OTHER_LEADER:
        return ConsumePartitionResult(partition, flags, leader=draw(endpoints))
    return ConsumePartitionResult(partition, flags)


def consume_topics(count: st.SearchStrategy[int]) -> st.SearchStrategy[ConsumeTopicResult]:
    known = st.builds(ConsumeTopicResult, names, small_lists(consume_results(), 4))
    unknown = st.builds(ConsumeTopicResult, names, st.just([]), st.just(True), count)
    return st.one_of(known, unknown)


def discovered_partitions() -> st.SearchStrategy[DiscoveredPartition]:
    bounds = st.builds(DiscoveredPartition, u64s, u64s).filter(
        lambda p: (p.first_available_seq_num, p.high_water_mark) != (U64_MAX, U64_MAX))
    faults = st.builds(DiscoveredPartition, st.just(0), st.just(0),
                       st.sampled_from([0xFB, 0xFD, 0xFF]))
    redirect = st.builds(DiscoveredPartition, st.just(0), st.just(0), st.just(0xFC), endpoints)
    return st.one_of(bounds, faults, redirect)


@st.composite
def cluster_nodes(draw: st.DrawFn) -> ClusterNode:
    flags = draw(u8s)
    endpoint = draw(endpoints) if flags & 1 else None
    return ClusterNode(draw(u16s), flags, endpoint, draw(u16s))


def answered_by(request_for: Any, responses: st.SearchStrategy[Any]
                ) -> st.SearchStrategy[tuple[Any, Any]]:
    return responses.map(lambda r: (request_for(r), r))


EXCHANGE_STRATEGIES = {
    "produce": produce_exchanges(),
    "consume": answered_by(
        lambda r: ConsumeRequest(2, r.request_id, "", 0, 0, topics=[]),
        st.builds(ConsumeResponse, u32s, small_lists(consume_topics(u8s)))),
    "consume_peer": answered_by(
        lambda r: ConsumePeerRequest(0, 0, 0, []),
        st.builds(ConsumePeerResponse, small_lists(consume_topics(u16s)))),
    "discover_partitions": answered_by(
        lambda r: DiscoverPartitionsRequest(r.request_id, r.topic, []),
        st.builds(DiscoverPartitionsResponse, u32s, names,
                  small_lists(discovered_partitions(), 5))),
    "create_topic": answered_by(
        lambda r: CreateTopicRequest(r.request_id, r.topic, 1, b""),
        st.builds(CreateTopicResponse, u32s, names, u8s)),
    "reload_conf": answered_by(
        lambda r: ReloadConfRequest(r.request_id, r.topic, r.partition),
        st.builds(ReloadConfResponse, u32s, names, u16s, u8s)),
    "status": answered_by(
        lambda r: StatusRequest(r.request_id),
        st.builds(StatusResponse, u32s, u8s, u8s, u32s, u32s,
                  st.none() | st.builds(StatusCluster, u8s, names, u32s),
                  u32s, u32s, u32s, u32s)),
    "discover_topics": answered_by(
        lambda r: DiscoverTopicsRequest(r.request_id, 0),
        st.builds(DiscoverTopicsResponse, u32s, st.one_of(
            small_lists(st.builds(DiscoveredTopic, names, st.booleans(), u16s, st.none())),
            small_lists(st.builds(DiscoveredTopic, names, st.booleans(), u16s, u8s))))),
    "discover_topology": answered_by(
        lambda r: DiscoverTopologyRequest(r.request_id, 0),
        st.builds(DiscoverTopologyResponse, u32s, st.none() | st.builds(
            ClusterTopology, names, small_lists(cluster_nodes(), 4)))),
}


def test_every_response_has_a_strategy() -> None:
    declared = {c.spec.name for c in CODECS.values() if c.spec.kind == "response"}
    assert len(EXCHANGE_STRATEGIES) == len(declared)


@pytest.mark.parametrize("name", sorted(EXCHANGE_STRATEGIES))
@settings(max_examples=150)
@given(data=st.data())
def test_responses_round_trip(name: str, data: st.DataObject) -> None:
    request, response = data.draw(EXCHANGE_STRATEGIES[name])
    client, server = TankConnection(Role.CLIENT), TankConnection(Role.SERVER)
    server.receive_data(client.send(request))
    assert drain(server) == [request]
    client.receive_data(server.send(response))
    assert drain(client) == [Reply(request, response)]
    assert not client.pending
