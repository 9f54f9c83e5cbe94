"""Tank's messages: the record classes, msgIds and dispatch tables.

Every message is a frozen, slotted dataclass with snake_case fields, importable from here
under a plain name (``ProduceRequest``, ``ConsumeResponse``, ``ConsumePartitionResult``,
...). Most, and every payload codec, are generated from ``specs/`` into
:mod:`protocols.tank.records` (``python -m protocols.generate``); the records of the
irregular parts (the Consume response, the Produce results, ...) are the custom types'
in :mod:`protocols.tank.types`.

:func:`decode_request`, :func:`decode_response` and :func:`encode_payload` turn payloads
(no frame header) into records and back; :class:`protocols.tank.connection.TankConnection`
adds the framing and the request/response bookkeeping.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final

from protocols.errors import ProtocolError
from protocols.record import Record
from protocols.spec import Buffer, MessageCodec, TypeRegistry, load_package_codecs
from protocols.tank.records import (
    PAYLOAD_CODECS,
    ConsumePartition,
    ConsumePeerPartition,
    ConsumePeerRequest,
    ConsumePeerTopic,
    ConsumeRequest,
    ConsumeTopic,
    CreateTopicRequest,
    CreateTopicResponse,
    DiscoverPartitionsRequest,
    DiscoverPartitionsResponse,
    DiscoverTopicsRequest,
    DiscoverTopicsResponse,
    DiscoverTopologyRequest,
    DiscoverTopologyResponse,
    Ping,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    ProduceWithSeqnumRequest,
    ProduceWithSeqnumTopic,
    RegReplicaRequest,
    ReloadConfRequest,
    ReloadConfResponse,
    StatusRequest,
    StatusResponse,
    decode_produce_request,
)
from protocols.tank.types import (
    CONSUME_PEER_RESPONSE_BODY,
    CONSUME_RESPONSE_BODY,
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


#: The byte order and custom types the generated codecs were made with.
REGISTRY: Final = TypeRegistry("little", CUSTOM_TYPES)
#: Payload codecs by message name ("ProduceRequest", ...), generated from ``specs/*.json``.
CODECS: Final = load_package_codecs("protocols.tank", PAYLOAD_CODECS)

# -- dispatch tables -----------------------------------------------------------------------------
#: Codecs of what a client sends, by msgId (every msgId; Ping has no payload).
REQUEST_CODECS: Final = {MsgId(c.api_key): c for c in CODECS.values() if c.spec.kind == "request"}
#: Codecs of what a broker sends, by msgId (no RegReplica, ProduceWithSeqnum: they have none).
RESPONSE_CODECS: Final[dict[MsgId, MessageCodec[Any]]] = {
    MsgId(c.api_key): c for c in CODECS.values() if c.spec.kind == "response"}
RESPONSE_CODECS[MsgId.PING] = CODECS["Ping"]
if sorted(REQUEST_CODECS) != list(MsgId):
    raise ImportError("the Tank request declarations do not cover every MsgId")

def _encoder(codec: MessageCodec[Any]) -> Callable[[Any], bytes]:
    if codec.record is ConsumeResponse:
        body = CONSUME_RESPONSE_BODY
    elif codec.record is ConsumePeerResponse:
        body = CONSUME_PEER_RESPONSE_BODY
    else:
        return codec.encode

    def encode_joined(message: ConsumeResponse | ConsumePeerResponse) -> bytes:
        # Chunks can be megabytes: join once instead of growing a bytearray.
        head, _ = body.encode_head(message)
        return b"".join([head, *body.chunks(message)])
    return encode_joined


#: For each record class: the msgId it travels under and its payload encoder.
_ENCODERS: Final[dict[type, tuple[MsgId, Callable[[Any], bytes]]]] = {
    c.record: (msg_id, _encoder(c)) for msg_id, c in REQUEST_CODECS.items()}
_ENCODERS.update({c.record: (msg_id, _encoder(c)) for msg_id, c in RESPONSE_CODECS.items()})

#: Record classes a client sends; Ping is in both sets.
REQUEST_TYPES: Final = frozenset(c.record for c in REQUEST_CODECS.values())
#: Record classes a broker sends.
RESPONSE_TYPES: Final = frozenset(c.record for c in RESPONSE_CODECS.values())

#: The msgId a broker answers each request with (ProduceWithSeqnum: 0x01). Requests without
#: an answer (Ping, RegReplica) are absent.
RESPONSE_ID: Final[dict[type, MsgId]] = {
    c.record: msg_id for msg_id, c in REQUEST_CODECS.items() if msg_id in RESPONSE_CODECS
    and msg_id != MsgId.PING}
RESPONSE_ID[ProduceWithSeqnumRequest] = MsgId.PRODUCE


def encode_payload(message: object) -> tuple[MsgId, bytes]:
    """The msgId and payload of a record (a ProduceResponse always travels as 0x01).

    Raises TypeError for an object that is not a Tank record, ValueError for a record whose
    values do not fit the wire.
    """
    entry = _ENCODERS.get(type(message))
    if entry is None:
        raise TypeError(f"not a Tank message: {message!r}")
    msg_id, encode = entry
    return msg_id, encode(message)


#: The server's hot path: decodes a ProduceRequest payload (generated, like every codec).
_DECODE_REQUEST: Final[dict[int, Callable[[Buffer, int | None, object], Record]]] = {
    msg_id: PAYLOAD_CODECS[c.name][1] for msg_id, c in REQUEST_CODECS.items()}


def decode_request(msg_id: int, payload: bytes) -> Record:
    """Decode what a client sent; ProtocolError for an unknown msgId or a bad payload."""
    decode = _DECODE_REQUEST.get(msg_id)
    if decode is None:
        raise ProtocolError(f"unknown Tank request msgId 0x{msg_id:02x}")
    return decode(payload, None, None)


_RESPONSE_BY_ID: Final[dict[int, MessageCodec[Any]]] = {
    int(m): c for m, c in RESPONSE_CODECS.items()}


def decode_response(msg_id: int, payload: bytes, request: object = None) -> object:
    """Decode what a broker sent (the response record of ``msg_id``); ``request`` is the
    request it answers.

    Only a Produce response needs the request (it repeats no topics or partitions).
    ProtocolError for a msgId no broker sends or a bad payload.
    """
    codec = _RESPONSE_BY_ID.get(msg_id)
    if codec is None:
        raise ProtocolError(f"unknown Tank response msgId 0x{msg_id:02x}")
    return codec.decode(payload, context=request)


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
