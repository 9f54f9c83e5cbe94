"""Tank's messages: record classes compiled from ``specs/``, msgIds and the dispatch tables.

Every message is a slotted dataclass with snake_case fields, importable from here under a
plain name (``ProduceRequest``, ``ConsumeResponse``, ``ConsumePartitionResult``, ...).
Most come from the engine; the irregular ones are the records of the custom types in
:mod:`protocols.tank.types`.

:func:`decode_request`, :func:`decode_response` and :func:`encode_payload` turn payloads
(no frame header) into records and back; :class:`protocols.tank.connection.TankConnection`
adds the framing and the request/response bookkeeping.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any, Final

from protocols.errors import ProtocolError
from protocols.spec import MessageCodec, TypeRegistry, load_package_specs
from protocols.tank.types import (
    CUSTOM_TYPES,
    ClusterNode,
    ClusterTopology,
    ConsumeFlags,
    ConsumePartitionResult,
    ConsumePeerResponse,
    ConsumeResponse,
    ConsumeTopicResult,
    CreateTopicError,
    DiscoveredPartition,
    DiscoveredTopic,
    Endpoint,
    ProduceError,
    ProducePartitionResult,
    ProduceTopicResult,
    ProduceWithSeqnumPartition,
    ReloadConfError,
    StatusCluster,
)
from protocols.wire import U16LE, decode_varint


class MsgId(enum.IntEnum):
    """The ``u8 msgId`` of a frame."""

    PRODUCE = 0x01
    CONSUME = 0x02
    PING = 0x03
    REG_REPLICA = 0x04
    PRODUCE_WITH_SEQNUM = 0x05
    DISCOVER_PARTITIONS = 0x06
    CREATE_TOPIC = 0x07
    RELOAD_CONF = 0x08
    CONSUME_PEER = 0x09
    STATUS = 0x0A
    DISCOVER_TOPICS = 0x0B
    DISCOVER_TOPOLOGY = 0x0C


REGISTRY: Final = TypeRegistry("little", CUSTOM_TYPES)
#: Engine codecs by message name ("ProduceRequest", ...), compiled from ``specs/*.json``.
CODECS: Final[dict[str, MessageCodec]] = load_package_specs("protocols.tank", REGISTRY)

# -- record classes ------------------------------------------------------------------------------
_produce = CODECS["ProduceRequest"]
ProduceRequest: Final[type[Any]] = _produce.record
ProduceTopic: Final[type[Any]] = _produce.nested("topics")
ProducePartition: Final[type[Any]] = _produce.nested("topics", "partitions")
ProduceWithSeqnumRequest: Final[type[Any]] = CODECS["ProduceWithSeqnumRequest"].record
ProduceWithSeqnumTopic: Final[type[Any]] = CODECS["ProduceWithSeqnumRequest"].nested("topics")
ProduceResponse: Final[type[Any]] = CODECS["ProduceResponse"].record

_consume = CODECS["ConsumeRequest"]
ConsumeRequest: Final[type[Any]] = _consume.record
ConsumeTopic: Final[type[Any]] = _consume.nested("topics")
ConsumePartition: Final[type[Any]] = _consume.nested("topics", "partitions")

Ping: Final[type[Any]] = CODECS["Ping"].record
RegReplicaRequest: Final[type[Any]] = CODECS["RegReplicaRequest"].record
DiscoverPartitionsRequest: Final[type[Any]] = CODECS["DiscoverPartitionsRequest"].record
DiscoverPartitionsResponse: Final[type[Any]] = CODECS["DiscoverPartitionsResponse"].record
CreateTopicRequest: Final[type[Any]] = CODECS["CreateTopicRequest"].record
CreateTopicResponse: Final[type[Any]] = CODECS["CreateTopicResponse"].record
ReloadConfRequest: Final[type[Any]] = CODECS["ReloadConfRequest"].record
ReloadConfResponse: Final[type[Any]] = CODECS["ReloadConfResponse"].record

_consume_peer = CODECS["ConsumePeerRequest"]
ConsumePeerRequest: Final[type[Any]] = _consume_peer.record
ConsumePeerTopic: Final[type[Any]] = _consume_peer.nested("topics")
ConsumePeerPartition: Final[type[Any]] = _consume_peer.nested("topics", "partitions")

StatusRequest: Final[type[Any]] = CODECS["StatusRequest"].record
StatusResponse: Final[type[Any]] = CODECS["StatusResponse"].record
DiscoverTopicsRequest: Final[type[Any]] = CODECS["DiscoverTopicsRequest"].record
DiscoverTopicsResponse: Final[type[Any]] = CODECS["DiscoverTopicsResponse"].record
DiscoverTopologyRequest: Final[type[Any]] = CODECS["DiscoverTopologyRequest"].record
DiscoverTopologyResponse: Final[type[Any]] = CODECS["DiscoverTopologyResponse"].record

# -- dispatch tables -----------------------------------------------------------------------------
#: Codecs of what a client sends, by msgId (every msgId; Ping has no payload).
REQUEST_CODECS: Final = {MsgId(c.api_key): c for c in CODECS.values() if c.spec.kind == "request"}
#: Codecs of what a broker sends, by msgId (no RegReplica, ProduceWithSeqnum: they have none).
RESPONSE_CODECS: Final = {
    MsgId(c.api_key): c for c in CODECS.values() if c.spec.kind == "response"}
RESPONSE_CODECS[MsgId.PING] = CODECS["Ping"]
if sorted(REQUEST_CODECS) != list(MsgId):
    raise ImportError("the Tank request declarations do not cover every MsgId")

# Consume and ConsumePeer responses are one custom type wrapped in a one-field record.
_WRAPPED: Final = {MsgId.CONSUME: ConsumeResponse, MsgId.CONSUME_PEER: ConsumePeerResponse}


def _encoder(codec: MessageCodec, wrapped: bool) -> Callable[[Any], bytes]:
    if not wrapped:
        return codec.encode
    body = REGISTRY.custom[codec.spec.fields[0].type]

    def encode_joined(message: Any) -> bytes:
        # Chunks can be megabytes: join once instead of growing a bytearray.
        head, _ = body.encode_head(message)
        return b"".join([head, *body.chunks(message)])
    return encode_joined


#: For each record class: the msgId it travels under and its payload encoder.
_ENCODERS: Final[dict[type, tuple[MsgId, Callable[[Any], bytes]]]] = {
    c.record: (msg_id, _encoder(c, False)) for msg_id, c in REQUEST_CODECS.items()}
_ENCODERS.update({
    c.record: (msg_id, _encoder(c, False)) for msg_id, c in RESPONSE_CODECS.items()
    if msg_id not in _WRAPPED})
_ENCODERS.update({
    record: (msg_id, _encoder(RESPONSE_CODECS[msg_id], True))
    for msg_id, record in _WRAPPED.items()})

#: Record classes a client sends; Ping is in both sets.
REQUEST_TYPES: Final = frozenset(c.record for c in REQUEST_CODECS.values())
#: Record classes a broker sends.
RESPONSE_TYPES: Final = frozenset(
    {c.record for m, c in RESPONSE_CODECS.items() if m not in _WRAPPED} | set(_WRAPPED.values()))

#: The msgId a broker answers each request with (ProduceWithSeqnum: 0x01). Requests without
#: an answer (Ping, RegReplica) are absent.
RESPONSE_ID: Final[dict[type, MsgId]] = {
    c.record: msg_id for msg_id, c in REQUEST_CODECS.items() if msg_id in RESPONSE_CODECS
    and msg_id != MsgId.PING}
RESPONSE_ID[ProduceWithSeqnumRequest] = MsgId.PRODUCE


def encode_payload(message: Any) -> tuple[MsgId, bytes]:
    """The msgId and payload of a record (a ProduceResponse always travels as 0x01).

    Raises TypeError for an object that is not a Tank record, ValueError for a record whose
    values do not fit the wire.
    """
    entry = _ENCODERS.get(type(message))
    if entry is None:
        raise TypeError(f"not a Tank message: {message!r}")
    msg_id, encode = entry
    return msg_id, encode(message)


_PRODUCE_HEAD = struct.Struct("<HIB")  # client_version | request_id | client_id length
_PRODUCE_ACKS = struct.Struct("<BIB")  # required_acks | ack_timeout_ms | topic count


def decode_produce_request(payload: bytes) -> Any:
    """``CODECS["ProduceRequest"].decode`` unrolled by hand: the server's hot path.

    Same records, same result and ProtocolError on bad input as the declared codec (the
    tests hold the two to it); about 3x faster.
    """
    try:
        return _decode_produce(bytes(payload))
    except (struct.error, IndexError):
        raise ProtocolError("truncated ProduceRequest") from None
    except UnicodeDecodeError:
        raise ProtocolError("ProduceRequest string is not UTF-8") from None


def _decode_produce(buf: bytes) -> Any:
    """Decode a ProduceRequest; a read past the end raises struct.error or IndexError."""
    end = len(buf)
    version, request_id, length = _PRODUCE_HEAD.unpack_from(buf, 0)
    pos = 7 + length
    if pos > end:
        raise IndexError("client id")
    client_id = buf[7:pos].decode()
    acks, ack_timeout, topic_count = _PRODUCE_ACKS.unpack_from(buf, pos)
    pos += 6
    read_u16 = U16LE.unpack_from
    topics = []
    for _ in range(topic_count):
        name_end = pos + 1 + buf[pos]
        if name_end > end:
            raise IndexError("topic name")
        name = buf[pos + 1:name_end].decode()
        pos = name_end + 1
        partitions = []
        for _ in range(buf[name_end]):
            partition = read_u16(buf, pos)[0]
            length = buf[pos + 2]
            if length < 0x80:
                pos += 3
            else:
                decoded = decode_varint(buf, pos + 2, end)
                if decoded is None:
                    raise IndexError("bundle length")
                length, pos = decoded
            stop = pos + length
            if stop > end:
                raise IndexError("bundle")
            partitions.append(ProducePartition(partition, buf[pos:stop]))
            pos = stop
        topics.append(ProduceTopic(name, partitions))
    if pos != end:
        raise ProtocolError(f"{end - pos} unexpected trailing bytes in ProduceRequest")
    return ProduceRequest(version, request_id, client_id, acks, ack_timeout, topics)


def decode_request(msg_id: int, payload: bytes) -> Any:
    """Decode what a client sent; ProtocolError for an unknown msgId or a bad payload."""
    if msg_id == MsgId.PRODUCE:
        return decode_produce_request(payload)
    codec = REQUEST_CODECS.get(msg_id)
    if codec is None:
        raise ProtocolError(f"unknown Tank request msgId 0x{msg_id:02x}")
    return codec.decode(payload)


def decode_response(msg_id: int, payload: bytes, request: Any = None) -> Any:
    """Decode what a broker sent; ``request`` is the request it answers.

    Only a Produce response needs the request (it repeats no topics or partitions).
    ProtocolError for a msgId no broker sends or a bad payload.
    """
    codec = RESPONSE_CODECS.get(msg_id)
    if codec is None:
        raise ProtocolError(f"unknown Tank response msgId 0x{msg_id:02x}")
    record = codec.decode(payload, context=request)
    return record.body if msg_id in _WRAPPED else record


__all__ = [
    "CODECS", "REGISTRY", "REQUEST_CODECS", "REQUEST_TYPES", "RESPONSE_CODECS", "RESPONSE_ID",
    "RESPONSE_TYPES", "ClusterNode", "ClusterTopology", "ConsumeFlags",
    "ConsumePartition", "ConsumePartitionResult", "ConsumePeerPartition", "ConsumePeerRequest",
    "ConsumePeerResponse", "ConsumePeerTopic", "ConsumeRequest", "ConsumeResponse",
    "ConsumeTopic", "ConsumeTopicResult", "CreateTopicError", "CreateTopicRequest",
    "CreateTopicResponse", "DiscoverPartitionsRequest", "DiscoverPartitionsResponse",
    "DiscoverTopicsRequest", "DiscoverTopicsResponse", "DiscoverTopologyRequest",
    "DiscoverTopologyResponse", "DiscoveredPartition", "DiscoveredTopic", "Endpoint",
    "MsgId", "Ping", "ProduceError", "ProducePartition", "ProducePartitionResult",
    "ProduceRequest", "ProduceResponse", "ProduceTopic", "ProduceTopicResult",
    "ProduceWithSeqnumPartition", "ProduceWithSeqnumRequest", "ProduceWithSeqnumTopic",
    "RegReplicaRequest", "ReloadConfError", "ReloadConfRequest", "ReloadConfResponse",
    "StatusCluster", "StatusRequest", "StatusResponse", "decode_produce_request",
    "decode_request", "decode_response", "encode_payload",
]
