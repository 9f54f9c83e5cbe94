"""Golden bytes, built by hand from the protocol guide (kafka.apache.org/protocol) and
checked field by field: the request and response headers of both versions, ApiVersions
v0 and v3 (flexible), Metadata v1 and v12, Produce v3, and the compact encodings."""

from __future__ import annotations

import struct

import pytest

from protocols.errors import ProtocolError
from protocols.kafka import records as r
from protocols.kafka.connection import Request, decode_request, encode_response, frame
from protocols.kafka.messages import CODECS
from protocols.kafka.primitives import read_uvarint, write_uvarint

# ApiVersions v3 as librdkafka sends it first: request header v2 then the flexible body.
API_VERSIONS_V3_REQUEST = bytes.fromhex(
    "0012"  # api key 18
    "0003"  # version 3
    "00000001"  # correlation id 1
    "0007") + b"rdkafka" + bytes.fromhex(  # client id: int16 length even in header v2
    "00"  # header tagged fields: none
    "0b") + b"librdkafka" + bytes.fromhex(  # compact string: length 10, plus one
    "07") + b"2.16.0" + bytes.fromhex(
    "00")  # body tagged fields: none

# Its answer: response header v0 (ApiVersions answers always use it), flexible body.
API_VERSIONS_V3_RESPONSE = bytes.fromhex(
    "00000001"  # correlation id
    "0000"  # error code
    "03"  # compact array of 2 entries
    "0000" "0003" "0009" "00"  # Produce 3-9, no tagged fields
    "0012" "0000" "0003" "00"  # ApiVersions 0-3
    "00000000"  # throttle time
    "02"  # two tagged fields, in tag order:
    "01" "08" "0000000000000007"  # tag 1 FinalizedFeaturesEpoch = 7 (int64)
    "03" "01" "01")  # tag 3 ZkMigrationReady = true


def test_api_versions_v3_request() -> None:
    event = decode_request(API_VERSIONS_V3_REQUEST)
    assert event == Request(18, 3, 1, "rdkafka",
                            r.ApiVersionsRequest("librdkafka", "2.16.0"))
    body = CODECS["ApiVersionsRequest"].encode(event.body, version=3)
    assert body == API_VERSIONS_V3_REQUEST[len(API_VERSIONS_V3_REQUEST) - len(body):]


def test_api_versions_v3_response() -> None:
    body = r.ApiVersionsResponse(0, [r.ApiVersion(0, 3, 9), r.ApiVersion(18, 0, 3)], 0,
                                 finalized_features_epoch=7, zk_migration_ready=True)
    wire = encode_response(18, 3, 1, body)
    assert wire == frame(API_VERSIONS_V3_RESPONSE)
    assert CODECS["ApiVersionsResponse"].decode(API_VERSIONS_V3_RESPONSE[4:], version=3) == body


def test_api_versions_v0_response() -> None:
    body = r.ApiVersionsResponse(35, [r.ApiVersion(18, 0, 3)])
    assert encode_response(18, 0, 9, body) == frame(bytes.fromhex(
        "00000009" "0023" "00000001" "0012" "0000" "0003"))


def test_metadata_v1_request_for_all_topics() -> None:
    wire = bytes.fromhex("0003" "0001" "0000002a" "0003") + b"cli" + bytes.fromhex("ffffffff")
    assert decode_request(wire) == Request(3, 1, 42, "cli", r.MetadataRequest(topics=None))


def test_metadata_v12_request() -> None:
    wire = (bytes.fromhex("0003" "000c" "0000002a" "ffff" "00")  # null client id, no tags
            + bytes.fromhex("02") + bytes(16) + b"\x07orders" + b"\x00"  # one topic
            + bytes.fromhex("01" "00" "00"))  # auto-create, no authorized ops, no tags
    event = decode_request(wire)
    assert event == Request(3, 12, 42, None, r.MetadataRequest(
        [r.MetadataRequestTopic(bytes(16), "orders")], allow_auto_topic_creation=True))


# librdkafka 2.x's Metadata v12 requests, captured off a loopback socket
# (confluent-kafka 2.16 AdminClient.list_topics()). It writes a 4-byte int32 placeholder
# for the topic count and, for "all topics", leaves it as is instead of rewriting it as a
# compact count: the first 00 reads as a null array, the next three as
# AllowAutoTopicCreation=false, IncludeTopicAuthorizedOperations=false and no tagged
# fields; what it meant for those fields (01 00 00) follows as 3 bytes Kafka ignores.
LIBRDKAFKA_METADATA_BROKERS_ONLY = bytes.fromhex(
    "0003" "000c" "00000002" "0007") + b"rdkafka" + bytes.fromhex(
    "00"  # header tagged fields
    "01"  # topics: compact array of 0 entries
    "00" "00" "00")  # no auto-create, no authorized operations, no tagged fields
LIBRDKAFKA_METADATA_ALL_TOPICS = bytes.fromhex(
    "0003" "000c" "00000003" "0007") + b"rdkafka" + bytes.fromhex(
    "00"  # header tagged fields
    "00" "00" "00" "00"  # int32 placeholder 0: null topics, then as the three fields
    "01" "00" "00")  # what librdkafka meant for them: ignored, as Kafka does


def test_librdkafka_metadata_v12_for_brokers_only() -> None:
    assert decode_request(LIBRDKAFKA_METADATA_BROKERS_ONLY) == Request(
        3, 12, 2, "rdkafka", r.MetadataRequest(topics=[], allow_auto_topic_creation=False))


def test_librdkafka_metadata_v12_for_all_topics() -> None:
    # The fields decode as Kafka's broker decodes them; the 3 trailing bytes are ignored.
    assert decode_request(LIBRDKAFKA_METADATA_ALL_TOPICS) == Request(
        3, 12, 3, "rdkafka", r.MetadataRequest(topics=None, allow_auto_topic_creation=False))
    # The codec itself is strict: the body alone has 3 bytes past its fields.
    body = LIBRDKAFKA_METADATA_ALL_TOPICS[len(LIBRDKAFKA_METADATA_ALL_TOPICS) - 7:]
    with pytest.raises(ProtocolError, match="3 unexpected trailing bytes"):
        CODECS["MetadataRequest"].decode(body, version=12)


def test_metadata_v12_response_header_is_v1() -> None:
    wire = encode_response(3, 12, 5, r.MetadataResponse())
    # size | correlation id | header tags | throttle | brokers [] | cluster id null |
    # controller -1 | topics [] | tags
    assert wire == frame(bytes.fromhex("00000005" "00" "00000000" "01" "00" "ffffffff" "01"
                                       "00"))


def test_produce_v3_request() -> None:
    batch = b"\x00" * 61
    wire = (bytes.fromhex("0000" "0003" "00000007" "0001") + b"p"
            + bytes.fromhex("ffff" "ffff" "00007530" "00000001" "0006") + b"orders"
            + bytes.fromhex("00000001" "00000002") + struct.pack(">i", 61) + batch)
    assert decode_request(wire) == Request(0, 3, 7, "p", r.ProduceRequest(
        None, -1, 30000, [r.TopicProduceData("orders", [r.PartitionProduceData(2, batch)])]))


@pytest.mark.parametrize(("value", "encoded"), [
    (0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (300, "ac02"),
    (0xFFFFFFFF, "ffffffff0f")])
def test_unsigned_varints(value: int, encoded: str) -> None:
    out = bytearray()
    write_uvarint(out, value)
    assert out.hex() == encoded
    raw = bytes.fromhex(encoded)
    assert read_uvarint(raw, 0, len(raw), "v") == (value, len(raw))


@pytest.mark.parametrize("bad", ["8080808010", "ffffffff1f", "808080808001", "80"])
def test_bad_unsigned_varints(bad: str) -> None:
    raw = bytes.fromhex(bad)
    with pytest.raises(ProtocolError):
        read_uvarint(raw, 0, len(raw), "v")
