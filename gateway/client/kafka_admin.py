"""A small Kafka admin client (trio) for what ``figtank groups``, ``figtank fetch`` and
``--from-group`` ask a figtank Kafka listener: committed offsets (OffsetFetch,
OffsetCommit), log bounds (ListOffsets), partition counts (Metadata), a partition's
records (Fetch), and, when the server coordinates groups, their state and members
(ListGroups, DescribeGroups).

One connection, one request at a time, each at the highest version both sides speak
(learnt with ApiVersions). It speaks to figtank only: one node, which coordinates every
group, so no coordinator lookup and no leader routing.
"""

from __future__ import annotations

import ssl
import struct
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final, cast

import trio

import protocols.kafka.records as records
from gateway.client.errors import BadResponse, ConnectError, ConnectionLost, RequestTimeout
from protocols.errors import ProtocolError
from protocols.kafka.batch import read_batches
from protocols.kafka.messages import (
    REQUESTS,
    RESPONSES,
    SUPPORTED_VERSIONS,
    request_header_version,
    response_header_version,
)
from protocols.kafka.records import (
    ApiVersionsRequest,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
    RequestHeader,
    encode_request_header,
    read_response_header,
)
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.record import Answer, Request

#: ListOffsets' timestamps for the bounds.

__all__ = [
    "CLIENT_ID", "EARLIEST", "LATEST", "FetchResult", "GroupDescription", "GroupMember",
    "KafkaAdminClient", "KafkaError", "KafkaRecord", "consumer_assignment",
    "group_position", "open_kafka_admin",
]

LATEST: Final = -1
EARLIEST: Final = -2
CLIENT_ID: Final = "figtank-admin"
_MAX_FRAME: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class KafkaRecord:
    """One record a Fetch returned, at its absolute offset."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...] = ()


@dataclass(frozen=True)
class FetchResult:
    """A partition's records from the offset asked, and its bounds."""

    records: list[KafkaRecord]
    high_watermark: int
    log_start_offset: int


class KafkaError(BadResponse):
    """The server answered a Kafka error code where the caller needed success."""

    def __init__(self, what: str, code: int) -> None:
        try:
            name = ErrorCode(code).name
        except ValueError:
            name = f"error {code}"
        super().__init__(f"{what}: {name}")
        self.code = code


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A member of a group, as DescribeGroups tells (its assigned partitions decoded from
    the consumer protocol's assignment)."""

    member_id: str
    client_id: str
    client_host: str
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A group's state (``Empty``, ``Stable``, ...; ``Dead``: unknown) and members."""

    group_id: str
    state: str
    members: tuple[GroupMember, ...]

    @property
    def active(self) -> bool:
        return self.state not in ("Empty", "Dead", "")


class KafkaAdminClient:
    """Requests over one connected stream; make one with :func:`open_kafka_admin`."""

    def __init__(self, stream: trio.abc.Stream, timeout: float) -> None:
        self._stream = stream
        self._timeout = timeout
        self._correlation = 0
        self._buffer = bytearray()
        #: What the server serves: ``{api_key: (min, max)}``.
        self.versions: dict[int, tuple[int, int]] = {}

    def serves(self, api_key: int) -> bool:
        """Whether the server serves ``api_key`` in a version this client speaks."""
        return self._version(api_key) is not None

    def _version(self, api_key: int) -> int | None:
        ours = SUPPORTED_VERSIONS.get(api_key)
        theirs = self.versions.get(api_key)
        if ours is None or theirs is None:
            return None
        high = min(ours[1] if ours[1] is not None else ours[0], theirs[1])
        return high if high >= max(ours[0], theirs[0]) else None


    async def call(self, api_key: int, body: Request[Answer], version: int | None = None
                   ) -> Answer:
        """Send one request and return its answer's body (at the highest common version,
        unless ``version``)."""
        if version is None:
            version = self._version(api_key)
            if version is None:
                raise BadResponse(f"the server does not serve {ApiKey(api_key).name}")
        self._correlation += 1
        header = encode_request_header(
            RequestHeader(api_key, version, self._correlation, CLIENT_ID),
            request_header_version(api_key, version))
        payload = header + REQUESTS[api_key].encode(body, version=version)
        try:
            with trio.fail_after(self._timeout):
                await self._stream.send_all(struct.pack(">i", len(payload)) + payload)
                answer = await self._frame()
        except trio.TooSlowError:
            raise RequestTimeout(f"no answer to {ApiKey(api_key).name} in "
                                 f"{self._timeout:g} s") from None
        except (trio.BrokenResourceError, OSError) as exc:
            raise ConnectionLost(f"connection lost: {exc}") from None
        head, pos = read_response_header(answer, 0, len(answer),
                                         response_header_version(api_key, version))
        if head.correlation_id != self._correlation:
            raise BadResponse("answer to another request")
        # RESPONSES decodes the answer of api_key's request: the body's Answer.
        return cast(Answer, RESPONSES[api_key].decode(answer[pos:], version=version))

    async def _frame(self) -> bytes:
        buf = self._buffer
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            if len(buf) >= 4 and struct.unpack_from(">i", buf)[0] > _MAX_FRAME:
                raise BadResponse("answer larger than 64 MiB")
            data = await self._stream.receive_some(65536)
            if not data:
                raise ConnectionLost("the server closed the connection")
            buf += data
        size = struct.unpack_from(">i", buf)[0]
        frame = bytes(buf[4:4 + size])
        del buf[:4 + size]
        return frame

    async def handshake(self) -> None:
        """Learn the server's versions (ApiVersions version 0, which every server reads)."""
        answer = await self.call(ApiKey.API_VERSIONS, ApiVersionsRequest(), version=0)
        if answer.error_code:
            raise KafkaError("ApiVersions", answer.error_code)
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}

    # -- what the commands ask ----------------------------------------------------------

    async def partitions(self, topic: str) -> int | None:
        """The partition count of ``topic``, or None when there is no such topic."""
        answer = await self.call(ApiKey.METADATA, MetadataRequest(
            topics=[MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
        for found in answer.topics:
            if found.name == topic:
                if found.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    return None
                if found.error_code:
                    raise KafkaError(f"topic {topic}", found.error_code)
                return len(found.partitions)
        return None

    async def list_offsets(self, topic: str, partitions: Sequence[int], timestamp: int
                           ) -> dict[int, int]:
        """Each partition's offset at ``timestamp`` (:data:`EARLIEST`, :data:`LATEST` or
        milliseconds: the first message at or after it, -1 for none)."""
        answer = await self.call(ApiKey.LIST_OFFSETS, ListOffsetsRequest(
            replica_id=-1, topics=[ListOffsetsTopic(topic, [
                ListOffsetsPartition(partition_index=p, timestamp=timestamp)
                for p in partitions])]))
        found = {}
        for t in answer.topics:
            for p in t.partitions:
                if p.error_code:
                    raise KafkaError(f"offsets of {topic}/{p.partition_index}", p.error_code)
                found[p.partition_index] = p.offset
        return found

    async def fetch(self, topic: str, partition: int, offset: int, *, max_wait_ms: int = 0,
                    max_bytes: int = 1024 * 1024) -> FetchResult:
        """``partition``'s records from ``offset`` on (up to about ``max_bytes``; waiting up
        to ``max_wait_ms`` for the first one). Records before ``offset`` in the first
        batch and control batches are left out."""
        answer = await self.call(ApiKey.FETCH, FetchRequest(
            replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
            topics=[FetchTopic(topic=topic, partitions=[FetchPartition(
                partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes)])]))
        if answer.error_code:
            raise KafkaError(f"fetch of {topic}/{partition}", answer.error_code)
        found = [p for t in answer.responses if t.topic == topic for p in t.partitions
                 if p.partition_index == partition]
        if not found:
            raise BadResponse(f"the answer to a fetch of {topic}/{partition} lacks it")
        data = found[0]
        if data.error_code:
            raise KafkaError(f"fetch of {topic}/{partition} at {offset}", data.error_code)
        try:
            batches = read_batches(data.records or b"").batches
        except ProtocolError as exc:
            raise BadResponse(f"fetch of {topic}/{partition}: {exc}") from None
        records = [KafkaRecord(batch.base_offset + r.offset_delta,
                               batch.base_timestamp + r.timestamp_delta, r.key, r.value,
                               r.headers)
                   for batch in batches if not batch.control for r in batch.records
                   if batch.base_offset + r.offset_delta >= offset]
        return FetchResult(records, data.high_watermark, data.log_start_offset)

    async def committed(self, group: str, topics: Sequence[tuple[str, Sequence[int]]] | None
                        = None) -> dict[tuple[str, int], tuple[int, str | None]]:
        """``group``'s committed offsets ``{(topic, partition): (offset, metadata)}`` of
        the partitions asked (None: all it has); -1 where there is none."""
        version = self._version(ApiKey.OFFSET_FETCH)
        found_topics: list[OffsetFetchResponseTopics] | list[OffsetFetchResponseTopic]
        if version is not None and version >= 8:
            asked = None if topics is None else [OffsetFetchRequestTopics(t, list(p))
                                                 for t, p in topics]
            answer = await self.call(ApiKey.OFFSET_FETCH, OffsetFetchRequest(
                groups=[OffsetFetchRequestGroup(group_id=group, topics=asked)]))
            [found] = answer.groups
            code, found_topics = found.error_code, found.topics
        else:
            old = None if topics is None else [OffsetFetchRequestTopic(t, list(p))
                                               for t, p in topics]
            answer = await self.call(ApiKey.OFFSET_FETCH,
                                     OffsetFetchRequest(group_id=group, topics=old))
            code, found_topics = answer.error_code, answer.topics
        if code:
            raise KafkaError(f"offsets of group {group}", code)
        result = {}
        for t in found_topics:
            for p in t.partitions:
                if p.error_code:
                    raise KafkaError(f"offset of {group} on {t.name}/{p.partition_index}",
                                     p.error_code)
                result[(t.name, p.partition_index)] = (p.committed_offset, p.metadata)
        return result

    async def commit(self, group: str, offsets: dict[tuple[str, int], int]
                     ) -> dict[tuple[str, int], int]:
        """Commit ``offsets`` for ``group`` as a standalone client (generation -1, no
        member: refused while the group has members); each partition's error code."""
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_metadata=""))
        answer = await self.call(ApiKey.OFFSET_COMMIT, OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=-1, member_id="",
            topics=[OffsetCommitRequestTopic(t, p) for t, p in by_topic.items()]))
        return {(t.name, p.partition_index): p.error_code
                for t in answer.topics for p in t.partitions}

    async def list_groups(self) -> list[str] | None:
        """The groups the server knows of (None: it serves no ListGroups)."""
        request = getattr(records, "ListGroupsRequest", None)
        if request is None or not self.serves(ApiKey.LIST_GROUPS):
            return None
        answer = await self.call(ApiKey.LIST_GROUPS, request())
        if answer.error_code:
            raise KafkaError("ListGroups", answer.error_code)
        return sorted(g.group_id for g in answer.groups)

    async def describe_group(self, group: str) -> GroupDescription | None:
        """The group's state and members (None: the server serves no DescribeGroups)."""
        request = getattr(records, "DescribeGroupsRequest", None)
        if request is None or not self.serves(ApiKey.DESCRIBE_GROUPS):
            return None
        answer = await self.call(ApiKey.DESCRIBE_GROUPS, request(groups=[group]))
        [found] = answer.groups
        if found.error_code and found.error_code != ErrorCode.GROUP_ID_NOT_FOUND:
            raise KafkaError(f"group {group}", found.error_code)
        return GroupDescription(group, found.group_state or "Dead", tuple(
            GroupMember(m.member_id, m.client_id, m.client_host,
                        consumer_assignment(m.member_assignment))
            for m in found.members))


def consumer_assignment(data: bytes) -> tuple[tuple[str, int], ...]:
    """The partitions of a consumer protocol assignment (``int16 version, [topic
    string, [int32]], userdata``); empty when it is not one."""
    try:
        pos = 2
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        found = []
        for _ in range(max(count, 0)):
            (n,) = struct.unpack_from(">h", data, pos)
            topic = data[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
            (parts,) = struct.unpack_from(">i", data, pos)
            pos += 4
            for _ in range(max(parts, 0)):
                found.append((topic, struct.unpack_from(">i", data, pos)[0]))
                pos += 4
        return tuple(found)
    except (struct.error, UnicodeDecodeError):
        return ()


@asynccontextmanager
async def open_kafka_admin(host: str, port: int, *, timeout: float = 10.0,
                           ssl_context: ssl.SSLContext | None = None
                           ) -> AsyncIterator[KafkaAdminClient]:
    """A :class:`KafkaAdminClient` connected to ``host:port`` (its versions learnt) for
    the block; :class:`ConnectError` when the server can not be reached."""
    try:
        with trio.fail_after(timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_hostname=host)
                await stream.do_handshake()
    except trio.TooSlowError:
        raise ConnectError(f"cannot connect to {host}:{port}: no answer in "
                           f"{timeout:g} s") from None
    except (OSError, trio.BrokenResourceError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConnectError(f"cannot connect to {host}:{port}: {reason}") from None
    async with stream:
        client = KafkaAdminClient(stream, timeout)
        await client.handshake()
        yield client


async def group_position(host: str, port: int, group: str, topic: str, partition: int, *,
                         timeout: float = 10.0, ssl_context: ssl.SSLContext | None = None
                         ) -> int | None:
    """Where a Kafka consumer group is in ``topic``/``partition``, for a Figg subscriber or
    a Tank consumer to go on from: the Tank sequence (= Figg offset) of the last message
    the group consumed, which is its committed Kafka offset. Subscribe with
    ``from_offset=position`` (Figg resumes after it) or consume from sequence
    ``position + 1`` (Tank). None when the group has committed nothing there. Asked over
    the Kafka listener at ``host:port``."""
    async with open_kafka_admin(host, port, timeout=timeout, ssl_context=ssl_context) as admin:
        found = await admin.committed(group, [(topic, [partition])])
    offset = found.get((topic, partition), (-1, None))[0]
    return None if offset < 0 else offset
