"""Tank's irregular wire parts: hand-written codecs the declarations in ``specs/`` name.

Each ``*Type`` class implements :class:`protocols.spec.CustomType`; :mod:`protocols.tank.messages`
registers one instance of each under the type name the declarations use. The records they
produce are the slotted dataclasses below, and the error codes are the IntEnums.

Facts come from ``protocol-facts.md`` (the authority) and, where it is silent (clustered
variants, ConsumePeer), from TANK's ``service_api*.cpp``.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from protocols.errors import ProtocolError
from protocols.spec import CustomType
from protocols.wire import U8, U16LE, U32LE, U64LE, UINT64_MAX, Reader, encode_varint


class ProduceError(enum.IntEnum):
    """Per-partition codes of a Produce response."""

    OK = 0
    UNKNOWN_PARTITION = 1
    IO_FAULT = 2
    ACK_TIMEOUT = 3
    INSUFFICIENT_REPLICAS = 4
    INVALID_SEQUENCE = 10
    OTHER_LEADER = 0xFC
    NO_LEADER = 0xFD
    READ_ONLY = 0xFE
    UNKNOWN_TOPIC = 0xFF


class ConsumeFlags(enum.IntEnum):
    """``errorOrFlags`` of a Consume response partition (also DiscoverPartitions' reasons)."""

    OK = 0
    BOUNDARY_CHECK = 1
    SYSTEM_FAULT = 0xFB
    OTHER_LEADER = 0xFC
    NO_LEADER = 0xFD
    SPARSE_FIRST_BUNDLE = 0xFE
    UNKNOWN_PARTITION = 0xFF


class CreateTopicError(enum.IntEnum):
    """Codes of a CreateTopic response."""

    OK = 0
    EXISTS = 1
    SYSTEM_ERROR = 2
    INVALID_CONFIG = 4
    READ_ONLY = 5
    INVALID_REQUEST = 10  # invalid name or zero partitions


class ReloadConfError(enum.IntEnum):
    """Codes of a ReloadConf response."""

    OK = 0
    IO_FAULT = 2
    PARSE_ERROR = 3
    UNKNOWN_PARTITION = 10
    UNKNOWN_TOPIC = 11
    CLUSTERED = 12  # TANK's source: not supported when cluster-aware


#: Consume response variants that carry a chunk.
CHUNK_FLAGS: Final = frozenset((ConsumeFlags.OK, ConsumeFlags.SPARSE_FIRST_BUNDLE))
#: Per-topic Produce codes: one byte stands for every partition of the topic.
TOPIC_WIDE_PRODUCE_ERRORS: Final = frozenset((ProduceError.UNKNOWN_TOPIC, ProduceError.READ_ONLY))

_ENDPOINT = struct.Struct("<4sH")
_U16_SENTINEL: Final = b"\xff\xff"


def _packer(codec: struct.Struct) -> Callable[..., bytes]:
    """``codec.pack`` that raises ValueError (not struct.error) for out-of-range values."""
    pack = codec.pack

    def pack_checked(*values: object) -> bytes:
        try:
            return pack(*values)
        except struct.error as exc:
            raise ValueError(f"cannot encode {values}: {exc}") from None
    return pack_checked


_pack_u8 = _packer(U8)
_pack_u16 = _packer(U16LE)
_pack_u32 = _packer(U32LE)
_pack_u64 = _packer(U64LE)


def _put_str8(out: bytearray, text: str) -> None:
    raw = text.encode()
    if len(raw) > 0xFF:
        raise ValueError(f"str8 longer than 255 bytes: {text[:20]!r}...")
    out.append(len(raw))
    out += raw


# -- endpoints ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Endpoint:
    """Another broker's address: ``u32 ipv4 | u16 port`` on the wire.

    TANK copies the ``in_addr`` bytes, so the four address bytes travel in network order;
    the port is little-endian like every other integer.
    """

    host: str  # dotted quad
    port: int


def _read_endpoint(reader: Reader) -> Endpoint:
    raw, port = reader.unpack(_ENDPOINT, "leader endpoint")
    return Endpoint(".".join(map(str, raw)), port)


def _endpoint_bytes(endpoint: Endpoint | None) -> bytes:
    if endpoint is None:
        raise ValueError("OTHER_LEADER needs the leader's endpoint")
    packed: bytes = ipaddress.IPv4Address(endpoint.host).packed + _pack_u16(endpoint.port)
    return packed


# -- ProduceWithSeqnum partition entry ---------------------------------------------------------

@dataclass(slots=True)
class ProduceWithSeqnumPartition:
    """One partition of a ProduceWithSeqnum request."""

    partition: int = 0
    first_seq_num: int = 0  # sequence number of the bundle's first message
    bundle: bytes = b""


class ProduceWithSeqnumPartitionType:
    """``u16 partitionId | varint bundleLen | u64 firstSeq | bundle``.

    ``firstSeq`` sits between the length and the bundle and is not counted in the length.
    """

    annotation = "ProduceWithSeqnumPartition"
    default = None

    def decode(self, reader: Reader, version: int, context: object) -> ProduceWithSeqnumPartition:
        partition = reader.u16le("partition id")
        length = reader.varint("bundle length")
        first_seq_num = reader.u64le("first sequence number")
        return ProduceWithSeqnumPartition(partition, first_seq_num, reader.take(length, "bundle"))

    def encode(self, value: ProduceWithSeqnumPartition, version: int, out: bytearray,
               context: object) -> None:
        out += _pack_u16(value.partition)
        out += encode_varint(len(value.bundle))
        out += _pack_u64(value.first_seq_num)
        out += value.bundle


# -- Produce response --------------------------------------------------------------------------

@dataclass(slots=True)
class ProducePartitionResult:
    """The outcome for one requested partition."""

    partition: int = 0
    error: int = ProduceError.OK
    leader: Endpoint | None = None  # set for OTHER_LEADER only


@dataclass(slots=True)
class ProduceTopicResult:
    """The outcomes for one requested topic, partitions in request order."""

    name: str = ""
    partitions: list[ProducePartitionResult] = field(default_factory=list)


class ProduceResultsType:
    """The codes after ``u32 reqId``: one u8 per requested partition, in request order.

    The response repeats no names or ids, so decoding needs the request (``context``); the
    results it returns carry them. UNKNOWN_TOPIC and READ_ONLY are one byte for the whole
    topic: decoded, every partition of that topic gets the code; to encode one, give every
    partition result of the topic that code. A topic requested with no partitions has no
    bytes at all.
    """

    annotation = "list[ProduceTopicResult]"
    default: list[Any] = []  # the generated records make a fresh list each

    def decode(self, reader: Reader, version: int, context: object) -> list[ProduceTopicResult]:
        topics = getattr(context, "topics", None)
        if topics is None:
            raise ValueError("decoding a Produce response needs its request as context")
        results = []
        for topic in topics:
            requested = topic.partitions
            partitions = []
            if requested:
                code = reader.u8("produce partition code")
                if code in TOPIC_WIDE_PRODUCE_ERRORS:
                    partitions = [ProducePartitionResult(p.partition, code) for p in requested]
                else:
                    for i, part in enumerate(requested):
                        if i:
                            code = reader.u8("produce partition code")
                        leader = None
                        if code == ProduceError.OTHER_LEADER:
                            leader = _read_endpoint(reader)
                        partitions.append(ProducePartitionResult(part.partition, code, leader))
            results.append(ProduceTopicResult(topic.name, partitions))
        return results

    def encode(self, value: Sequence[ProduceTopicResult], version: int, out: bytearray,
               context: object) -> None:
        for topic in value:
            partitions = topic.partitions
            if not partitions:
                continue
            first = partitions[0].error
            if first in TOPIC_WIDE_PRODUCE_ERRORS:
                if any(p.error != first for p in partitions):
                    raise ValueError(f"{ProduceError(first).name} covers the whole topic "
                                     f"{topic.name!r}: give every partition that code")
                out.append(first)
                continue
            for part in partitions:
                out.append(part.error)
                if part.error == ProduceError.OTHER_LEADER:
                    out += _endpoint_bytes(part.leader)


# -- Consume response --------------------------------------------------------------------------

@dataclass(slots=True)
class ConsumePartitionResult:
    """One partition of a Consume response.

    Which fields travel depends on ``flags`` (see :class:`ConsumeFlags`): OK carries
    ``base_seq_num``, ``high_water_mark`` and a chunk; SPARSE_FIRST_BUNDLE the same without
    ``base_seq_num`` (read it from the sparse bundle); BOUNDARY_CHECK ``high_water_mark`` and
    ``first_available_seq_num``; OTHER_LEADER ``leader``; the others nothing.

    ``chunk`` is the partition's run of ``varint bundleLen | bundle`` (the last bundle may
    be partial). A decoded result always has it for OK and SPARSE_FIRST_BUNDLE. To encode,
    give either ``chunk`` or only ``chunk_length`` (for :func:`encode_consume_response_head`,
    when the listener sends the bytes itself); when ``chunk`` is set it decides the length.
    """

    partition: int = 0
    flags: int = ConsumeFlags.OK
    base_seq_num: int = 0
    high_water_mark: int = 0
    chunk_length: int = 0
    first_available_seq_num: int = 0
    leader: Endpoint | None = None
    chunk: bytes | None = None


@dataclass(slots=True)
class ConsumeTopicResult:
    """One topic of a Consume response.

    An unknown topic (``unknown=True``) has no partitions; the broker still echoes the
    requested partition count, kept in ``requested_partitions``.
    """

    name: str = ""
    partitions: list[ConsumePartitionResult] = field(default_factory=list)
    unknown: bool = False
    requested_partitions: int = 0


@dataclass(slots=True)
class ConsumeResponse:
    """A Consume response (msgId 0x02)."""

    request_id: int = 0
    topics: list[ConsumeTopicResult] = field(default_factory=list)


@dataclass(slots=True)
class ConsumePeerResponse:
    """A ConsumePeer response (msgId 0x09): like Consume, without a request id."""

    topics: list[ConsumeTopicResult] = field(default_factory=list)


def chunk_length(result: ConsumePartitionResult) -> int:
    """The chunk length a partition result announces (0 for variants without a chunk)."""
    if result.flags not in CHUNK_FLAGS:
        return 0
    if result.chunk is None:
        return result.chunk_length
    if result.chunk_length not in (0, len(result.chunk)):
        raise ValueError(f"partition {result.partition}: chunk_length {result.chunk_length} "
                         f"but a chunk of {len(result.chunk)} bytes")
    return len(result.chunk)


_TOPIC_COUNT = struct.Struct("<IB")  # reqId | u8 nTopics
_PART_HEAD = struct.Struct("<HB")
_PART_OK = struct.Struct("<QQI")
_PART_SPARSE = struct.Struct("<QI")
_PART_BOUNDARY = struct.Struct("<QQIQ")
_OK: Final = int(ConsumeFlags.OK)
_SPARSE: Final = int(ConsumeFlags.SPARSE_FIRST_BUNDLE)
_BOUNDARY: Final = int(ConsumeFlags.BOUNDARY_CHECK)
_OTHER_LEADER: Final = int(ConsumeFlags.OTHER_LEADER)
_NOTHING_MORE: Final = frozenset((ConsumeFlags.UNKNOWN_PARTITION, ConsumeFlags.SYSTEM_FAULT,
                                  ConsumeFlags.NO_LEADER))


class ConsumeResponseBodyType:
    """The whole Consume (or ConsumePeer) response payload: header, then the chunks.

    ``peer=False``: ``u32 headerLen | u32 reqId | u8 nTopics``, ``u8`` partition counts.
    ``peer=True``: ``u32 headerLen | u16 nTopics``, ``u16`` partition counts.
    """

    default = None
    #: The message's whole payload: the generated codec returns this type's record.
    whole_payload = True

    def __init__(self, *, peer: bool) -> None:
        self.peer = peer
        self.annotation = "ConsumePeerResponse" if peer else "ConsumeResponse"
        self._count = U16LE if peer else U8

    # -- decoding (the client's hot path) ------------------------------------------------------

    def decode(self, reader: Reader, version: int, context: object
               ) -> ConsumeResponse | ConsumePeerResponse:
        buf, start, end = reader.buf, reader.pos, reader.end
        if end - start < 4:
            raise ProtocolError("consume response too short for its header length")
        header_len = U32LE.unpack_from(buf, start)[0]
        header_end = start + 4 + header_len
        if header_end > end:
            raise ProtocolError(f"consume response header length {header_len} exceeds the "
                                f"{end - start - 4} bytes that follow")
        try:
            response, chunked = self._decode_header(bytes(buf[start + 4:header_end]))
        except (struct.error, IndexError) as exc:
            raise ProtocolError(f"truncated consume response header: {exc}") from None
        except UnicodeDecodeError:
            raise ProtocolError("consume response topic name is not UTF-8") from None
        pos = header_end
        for result in chunked:
            length = result.chunk_length
            if length > end - pos:
                raise ProtocolError(f"chunk of {length} bytes for partition {result.partition} "
                                    f"overruns the consume response")
            result.chunk = bytes(buf[pos:pos + length])
            pos += length
        reader.pos = pos
        return response

    def _decode_header(self, head: bytes
                       ) -> tuple[ConsumeResponse | ConsumePeerResponse,
                                  list[ConsumePartitionResult]]:
        """Parse the header; struct.error/IndexError mean it was cut short."""
        if self.peer:
            request_id = 0
            topic_count = U16LE.unpack_from(head, 0)[0]
            off = 2
        else:
            request_id, topic_count = _TOPIC_COUNT.unpack_from(head, 0)
            off = 5
        peer = self.peer
        part_head = _PART_HEAD.unpack_from
        part_ok = _PART_OK.unpack_from
        part_sparse = _PART_SPARSE.unpack_from
        topics = []
        chunked: list[ConsumePartitionResult] = []
        for _ in range(topic_count):
            name_len = head[off]
            name_end = off + 1 + name_len
            if name_end > len(head):
                raise IndexError("topic name")
            name = head[off + 1:name_end].decode()
            if peer:
                count = U16LE.unpack_from(head, name_end)[0]
                off = name_end + 2
            else:
                count = head[name_end]
                off = name_end + 1
            if head[off:off + 2] == _U16_SENTINEL:
                topics.append(ConsumeTopicResult(name, [], True, count))
                off += 2
                continue
            partitions = []
            for _ in range(count):
                partition, flags = part_head(head, off)
                off += 3
                if flags == _OK:
                    base, hwm, length = part_ok(head, off)
                    off += 20
                    result = ConsumePartitionResult(partition, flags, base, hwm, length)
                    chunked.append(result)
                elif flags == _SPARSE:
                    hwm, length = part_sparse(head, off)
                    off += 12
                    result = ConsumePartitionResult(partition, flags, 0, hwm, length)
                    chunked.append(result)
                elif flags == _BOUNDARY:
                    zero, hwm, length, first = _PART_BOUNDARY.unpack_from(head, off)
                    off += 28
                    if zero or length:
                        raise ProtocolError(f"partition {partition}: a boundary error must "
                                            "carry base sequence 0 and chunk length 0")
                    result = ConsumePartitionResult(partition, flags, 0, hwm, 0, first)
                elif flags == _OTHER_LEADER:
                    raw, port = _ENDPOINT.unpack_from(head, off)
                    off += 6
                    result = ConsumePartitionResult(
                        partition, flags, leader=Endpoint(".".join(map(str, raw)), port))
                elif flags in _NOTHING_MORE:
                    result = ConsumePartitionResult(partition, flags)
                else:
                    raise ProtocolError(f"partition {partition}: unknown consume flags "
                                        f"0x{flags:02x}")
                partitions.append(result)
            topics.append(ConsumeTopicResult(name, partitions))
        if off != len(head):
            raise ProtocolError(f"consume response header length {len(head)} does not match "
                                f"its {off} bytes of topics")
        if peer:
            return ConsumePeerResponse(topics), chunked
        return ConsumeResponse(request_id, topics), chunked

    # -- encoding ------------------------------------------------------------------------------

    def encode_head(self, value: ConsumeResponse | ConsumePeerResponse) -> tuple[bytes, int]:
        """``u32 headerLen | header``, and the total length of the chunks that follow it."""
        try:
            return self._encode_head(value)
        except struct.error as exc:
            raise ValueError(f"cannot encode consume response: {exc}") from None

    def _encode_head(self, value: ConsumeResponse | ConsumePeerResponse) -> tuple[bytes, int]:
        out = bytearray(4)  # header length, patched below
        pack_count = self._count.pack
        if self.peer:
            out += U16LE.pack(len(value.topics))
        else:
            out += _TOPIC_COUNT.pack(value.request_id,  # type: ignore[union-attr]
                                     len(value.topics))
        chunks = 0
        for topic in value.topics:
            _put_str8(out, topic.name)
            if topic.unknown:
                out += pack_count(topic.requested_partitions)
                out += _U16_SENTINEL
                continue
            out += pack_count(len(topic.partitions))
            for result in topic.partitions:
                flags = result.flags
                out += _PART_HEAD.pack(result.partition, flags)
                if flags == _OK:
                    length = chunk_length(result)
                    out += _PART_OK.pack(result.base_seq_num, result.high_water_mark, length)
                    chunks += length
                elif flags == _SPARSE:
                    length = chunk_length(result)
                    out += _PART_SPARSE.pack(result.high_water_mark, length)
                    chunks += length
                elif flags == _BOUNDARY:
                    out += _PART_BOUNDARY.pack(0, result.high_water_mark, 0,
                                               result.first_available_seq_num)
                elif flags == _OTHER_LEADER:
                    out += _endpoint_bytes(result.leader)
                elif flags not in _NOTHING_MORE:
                    raise ValueError(f"unknown consume flags {flags}")
        U32LE.pack_into(out, 0, len(out) - 4)
        return bytes(out), chunks

    def chunks(self, value: ConsumeResponse | ConsumePeerResponse) -> list[bytes]:
        """The chunk bytes in header order; ValueError if a partition lacks its chunk."""
        chunks = []
        for topic in value.topics:
            for result in topic.partitions:
                if result.flags in CHUNK_FLAGS and chunk_length(result):
                    if result.chunk is None:
                        raise ValueError(
                            f"partition {result.partition} has no chunk bytes: send the head "
                            "with encode_consume_response_head() and the chunks yourself")
                    chunks.append(result.chunk)
        return chunks

    def encode(self, value: ConsumeResponse | ConsumePeerResponse, version: int,
               out: bytearray, context: object) -> None:
        head, _ = self.encode_head(value)
        out += head
        for chunk in self.chunks(value):
            out += chunk


# -- DiscoverPartitions response entry ---------------------------------------------------------

@dataclass(slots=True)
class DiscoveredPartition:
    """One partition of a DiscoverPartitions response.

    ``error`` is 0 for a partition that can be served; otherwise a :class:`ConsumeFlags`
    reason (the wire then carries ``u64 MAX | u64 MAX | u8 reason``) and the sequence
    numbers are meaningless (0).
    """

    first_available_seq_num: int = 0
    high_water_mark: int = 0
    error: int = 0
    leader: Endpoint | None = None  # OTHER_LEADER only


_BOUNDS = struct.Struct("<QQ")
_FAULT_BOUNDS: Final = _BOUNDS.pack(UINT64_MAX, UINT64_MAX)


class DiscoveredPartitionType:
    """``u64 firstAvailable | u64 hwm``, or ``u64 MAX | u64 MAX | u8 reason [| endpoint]``."""

    annotation = "DiscoveredPartition"
    default = None

    def decode(self, reader: Reader, version: int, context: object) -> DiscoveredPartition:
        first, hwm = reader.unpack(_BOUNDS, "partition bounds")
        if first != UINT64_MAX or hwm != UINT64_MAX:
            return DiscoveredPartition(first, hwm)
        reason = reader.u8("partition fault reason")
        if reason == 0:
            raise ProtocolError("partition fault without a reason")
        leader = _read_endpoint(reader) if reason == ConsumeFlags.OTHER_LEADER else None
        return DiscoveredPartition(0, 0, reason, leader)

    def encode(self, value: DiscoveredPartition, version: int, out: bytearray,
               context: object) -> None:
        if value.error:
            out += _FAULT_BOUNDS
            out.append(value.error)
            if value.error == ConsumeFlags.OTHER_LEADER:
                out += _endpoint_bytes(value.leader)
            return
        if value.first_available_seq_num == value.high_water_mark == UINT64_MAX:
            raise ValueError("bounds (MAX, MAX) mean a fault: set error instead")
        try:
            out += _BOUNDS.pack(value.first_available_seq_num, value.high_water_mark)
        except struct.error as exc:
            raise ValueError(f"partition bounds: {exc}") from None


# -- Status response: the clustered block ------------------------------------------------------

@dataclass(slots=True)
class StatusCluster:
    """What a clustered broker adds to its Status response."""

    flags: int = 0
    name: str = ""
    available_nodes: int = 0


#: Status response bytes after the cluster block: four u32 counters.
_STATUS_TAIL: Final = 16


class StatusClusterType:
    """``u8 flags | str8 name | u32 availableNodes``, present iff more than the tail follows."""

    annotation = "StatusCluster | None"
    default = None

    def decode(self, reader: Reader, version: int, context: object) -> StatusCluster | None:
        if reader.remaining <= _STATUS_TAIL:
            return None
        flags = reader.u8("cluster flags")
        name = reader.str8("cluster name")
        return StatusCluster(flags, name, reader.u32le("available nodes"))

    def encode(self, value: StatusCluster | None, version: int, out: bytearray,
               context: object) -> None:
        if value is None:
            return
        out += _pack_u8(value.flags)
        _put_str8(out, value.name)
        out += _pack_u32(value.available_nodes)


# -- DiscoverTopics response -------------------------------------------------------------------

@dataclass(slots=True)
class DiscoveredTopic:
    """One topic of a DiscoverTopics response."""

    name: str = ""
    enabled: bool = True
    partition_count: int = 0
    replication_factor: int | None = None  # sent only by a clustered broker


_TOPIC_INFO = struct.Struct("<BH")


class DiscoveredTopicsType:
    """``u32 n | u8 clusterAware``, per topic ``str8 | u8 enabled | u16 n | [u8 rf]``.

    Encoded as cluster-aware when the topics carry a replication factor (all or none).
    """

    annotation = "list[DiscoveredTopic]"
    default: list[Any] = []  # the generated records make a fresh list each

    def decode(self, reader: Reader, version: int, context: object) -> list[DiscoveredTopic]:
        count = reader.u32le("topic count")
        cluster_aware = reader.u8("cluster aware")
        if count * 4 > reader.remaining:
            raise ProtocolError(f"topic count {count} exceeds the {reader.remaining} bytes left")
        topics = []
        for _ in range(count):
            name = reader.str8("topic name")
            enabled, partitions = reader.unpack(_TOPIC_INFO, "topic")
            rf = reader.u8("replication factor") if cluster_aware else None
            topics.append(DiscoveredTopic(name, bool(enabled), partitions, rf))
        return topics

    def encode(self, value: Sequence[DiscoveredTopic], version: int, out: bytearray,
               context: object) -> None:
        cluster_aware = any(t.replication_factor is not None for t in value)
        if cluster_aware and any(t.replication_factor is None for t in value):
            raise ValueError("either every topic has a replication factor or none does")
        out += _pack_u32(len(value))
        out.append(cluster_aware)
        pack_info = _packer(_TOPIC_INFO)
        for topic in value:
            _put_str8(out, topic.name)
            out += pack_info(bool(topic.enabled), topic.partition_count)
            if topic.replication_factor is not None:  # cluster_aware: every topic has one
                out.append(topic.replication_factor)


# -- DiscoverTopology response -----------------------------------------------------------------

@dataclass(slots=True)
class ClusterNode:
    """One node of a clustered broker's topology."""

    node_id: int = 0
    flags: int = 0  # 1 has endpoint, 2 available, 4 blocked
    endpoint: Endpoint | None = None  # present iff flags & 1
    replica_for: int = 0  # partitions it replicates


@dataclass(slots=True)
class ClusterTopology:
    """A clustered broker's answer to DiscoverTopology."""

    name: str = ""
    nodes: list[ClusterNode] = field(default_factory=list)


_NODE_HEAD = struct.Struct("<HB")
_NODE_HAS_ENDPOINT: Final = 1


class ClusterTopologyType:
    """``u16 0xFFFF`` (standalone: None), or ``u16 n | str8 name | n x node``."""

    annotation = "ClusterTopology | None"
    default = None

    def decode(self, reader: Reader, version: int, context: object) -> ClusterTopology | None:
        count = reader.u16le("node count")
        if count == 0xFFFF:
            return None
        name = reader.str8("cluster name")
        if count * 5 > reader.remaining:
            raise ProtocolError(f"node count {count} exceeds the {reader.remaining} bytes left")
        nodes = []
        for _ in range(count):
            node_id, flags = reader.unpack(_NODE_HEAD, "node")
            endpoint = _read_endpoint(reader) if flags & _NODE_HAS_ENDPOINT else None
            nodes.append(ClusterNode(node_id, flags, endpoint, reader.u16le("replica count")))
        return ClusterTopology(name, nodes)

    def encode(self, value: ClusterTopology | None, version: int, out: bytearray,
               context: object) -> None:
        if value is None:
            out += _U16_SENTINEL
            return
        if len(value.nodes) >= 0xFFFF:
            raise ValueError(f"too many nodes: {len(value.nodes)}")
        out += U16LE.pack(len(value.nodes))
        _put_str8(out, value.name)
        pack_head = _packer(_NODE_HEAD)
        for node in value.nodes:
            if bool(node.flags & _NODE_HAS_ENDPOINT) != (node.endpoint is not None):
                raise ValueError(f"node {node.node_id}: flag bit 0 must match the endpoint")
            out += pack_head(node.node_id, node.flags)
            if node.endpoint is not None:
                out += _endpoint_bytes(node.endpoint)
            out += _pack_u16(node.replica_for)


#: The whole payload of a Consume and of a ConsumePeer response.
CONSUME_RESPONSE_BODY: Final = ConsumeResponseBodyType(peer=False)
CONSUME_PEER_RESPONSE_BODY: Final = ConsumeResponseBodyType(peer=True)

#: One instance of each custom type, by the name the declarations use.
CUSTOM_TYPES: Final[dict[str, CustomType[Any]]] = {
    "ProduceWithSeqnumPartition": ProduceWithSeqnumPartitionType(),
    "ProduceResults": ProduceResultsType(),
    "ConsumeResponseBody": CONSUME_RESPONSE_BODY,
    "ConsumePeerResponseBody": CONSUME_PEER_RESPONSE_BODY,
    "DiscoveredPartition": DiscoveredPartitionType(),
    "StatusCluster": StatusClusterType(),
    "DiscoveredTopics": DiscoveredTopicsType(),
    "ClusterTopology": ClusterTopologyType(),
}
