"""OffsetCommit, OffsetFetch and OffsetDelete: the groups' committed offsets.

A committed offset is Kafka's: the next offset the group reads, which is the Tank
sequence / Figg offset of the last message it consumed. Commits are checked against the
group's membership (:class:`~gateway.kafka.groups.membership.MembershipCheck`: the
coordinator, or a stand-in with no members), against the access policy (committing or
reading a topic's offsets needs ``subscribe`` on it; committing or deleting a group's
offsets ``subscribe`` on the group, reading them ``discover``, else
GROUP_AUTHORIZATION_FAILED) and against the topic's partitions; then stored durably
(:mod:`gateway.kafka.groups.offsets`) before the answer goes out.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.auth.policy import Operation
from gateway.kafka.context import RequestContext
from gateway.kafka.groups.handlers import group_allowed
from gateway.kafka.groups.offsets import Committed, OffsetStore
from protocols.kafka.records import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetDeleteResponsePartition,
    OffsetDeleteResponseTopic,
    OffsetFetchRequest,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartition,
    OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
)
from protocols.kafka.types import ErrorCode

#: The offset OffsetFetch answers for a partition without a committed offset.
NO_OFFSET = -1


async def _partition_counts(ctx: RequestContext, topics: list[str]) -> dict[str, int]:
    """How many partitions each of ``topics`` has (0: no such topic)."""
    counts = {}
    for name in dict.fromkeys(topics):
        infos = await ctx.backend.discover_partitions(name)
        counts[name] = len(infos) if infos else 0
    return counts


async def offset_commit(ctx: RequestContext, body: OffsetCommitRequest,
                        version: int) -> OffsetCommitResponse:
    """Answer an OffsetCommit: every partition's code, NONE once the commit is durable."""
    group = body.group_id
    codes: dict[tuple[str, int], int] = {}
    if not group:
        code: int = ErrorCode.INVALID_GROUP_ID
    elif not group_allowed(ctx, group, Operation.SUBSCRIBE, "offset_commit"):
        code = ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        code = ctx.membership.check_member(group, body.member_id,
                                           body.generation_id_or_member_epoch,
                                           body.group_instance_id)
    if code == ErrorCode.NONE:
        counts = await _partition_counts(ctx, [t.name for t in body.topics
                                               if ctx.access.may(t.name, Operation.SUBSCRIBE)])
        entries = []
        for topic in body.topics:
            for part in topic.partitions:
                key = (topic.name, part.partition_index)
                if topic.name not in counts:
                    codes[key] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif not 0 <= part.partition_index < counts[topic.name]:
                    codes[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    entries.append((topic.name, part.partition_index, part.committed_offset,
                                    part.committed_metadata))
        for (name, index, _, _), result in zip(
                entries, await ctx.offsets.commit(group, entries), strict=True):
            codes[(name, index)] = result
    response = OffsetCommitResponse(topics=[
        OffsetCommitResponseTopic(topic.name, [
            OffsetCommitResponsePartition(p.partition_index,
                                          codes.get((topic.name, p.partition_index), code))
            for p in topic.partitions])
        for topic in body.topics])
    refused = [(t.name, p.partition_index, p.error_code)
               for t in response.topics for p in t.partitions if p.error_code]
    if refused:
        ctx.refused("kafka_offset_commit_refused", group=group, member=body.member_id,
                    generation=body.generation_id_or_member_epoch, partitions=refused[:10])
    return response


def _fetch_group(ctx: RequestContext, store: OffsetStore, group: str,
                 topics: Sequence[OffsetFetchRequestTopic | OffsetFetchRequestTopics] | None
                 ) -> list[tuple[str, list[tuple[int, Committed | None, int]]]]:
    """``[(topic, [(partition, committed or None, error code)])]`` of ``group``: the
    partitions asked for, or (``topics`` None) every committed one the connection may
    read."""
    committed = store.committed(group) if group else {}
    if topics is None:
        by_topic: dict[str, list[tuple[int, Committed | None, int]]] = {}
        for (name, index), c in sorted(committed.items()):
            if ctx.access.may(name, Operation.SUBSCRIBE):
                by_topic.setdefault(name, []).append((index, c, ErrorCode.NONE))
        return list(by_topic.items())
    answers: list[tuple[str, list[tuple[int, Committed | None, int]]]] = []
    for topic in topics:
        allowed = ctx.access.may(topic.name, Operation.SUBSCRIBE)
        answers.append((topic.name, [
            (index, committed.get((topic.name, index)) if allowed else None,
             ErrorCode.NONE if allowed else ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            for index in topic.partition_indexes]))
    return answers


def _old_partition(index: int, c: Committed | None, code: int
                   ) -> OffsetFetchResponsePartition:
    if c is None:
        return OffsetFetchResponsePartition(index, NO_OFFSET, -1, "", code)
    return OffsetFetchResponsePartition(index, c.offset, -1, c.metadata, code)


def _partition(index: int, c: Committed | None, code: int) -> OffsetFetchResponsePartitions:
    if c is None:
        return OffsetFetchResponsePartitions(index, NO_OFFSET, -1, "", code)
    return OffsetFetchResponsePartitions(index, c.offset, -1, c.metadata, code)


async def offset_fetch(ctx: RequestContext, body: OffsetFetchRequest,
                       version: int) -> OffsetFetchResponse:
    """Answer an OffsetFetch: the committed offsets asked for (-1: none), of one group
    (versions 0-7) or of each group asked (version 8 and later)."""
    store = ctx.offsets
    refused = ErrorCode.GROUP_AUTHORIZATION_FAILED
    if version < 8:
        if not group_allowed(ctx, body.group_id, Operation.DISCOVER, "offset_fetch"):
            # Versions 0-1 have no top-level error code: every partition asked carries it.
            return OffsetFetchResponse(error_code=refused if version >= 2 else 0, topics=[
                OffsetFetchResponseTopic(t.name, [_old_partition(i, None, refused)
                                                  for i in t.partition_indexes])
                for t in body.topics or ()] if version < 2 else [])
        found = _fetch_group(ctx, store, body.group_id, body.topics)
        return OffsetFetchResponse(topics=[
            OffsetFetchResponseTopic(name, [_old_partition(*p) for p in parts])
            for name, parts in found])
    groups = []
    for asked in body.groups:
        if not group_allowed(ctx, asked.group_id, Operation.DISCOVER, "offset_fetch"):
            groups.append(OffsetFetchResponseGroup(asked.group_id, error_code=refused))
            continue
        found = _fetch_group(ctx, store, asked.group_id, asked.topics)
        groups.append(OffsetFetchResponseGroup(asked.group_id, [
            OffsetFetchResponseTopics(name, [_partition(*p) for p in parts])
            for name, parts in found]))
    return OffsetFetchResponse(groups=groups)


async def offset_delete(ctx: RequestContext, body: OffsetDeleteRequest,
                        version: int) -> OffsetDeleteResponse:
    """Answer an OffsetDelete: a group with members keeps its offsets
    (GROUP_SUBSCRIBED_TO_TOPIC); an unknown group is GROUP_ID_NOT_FOUND."""
    group = body.group_id
    empty = ctx.membership.is_empty(group) if group else True
    if not group:
        return OffsetDeleteResponse(error_code=ErrorCode.INVALID_GROUP_ID)
    if not group_allowed(ctx, group, Operation.SUBSCRIBE, "offset_delete"):
        return OffsetDeleteResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if empty and not ctx.offsets.has_group(group):
        return OffsetDeleteResponse(error_code=ErrorCode.GROUP_ID_NOT_FOUND)
    codes: dict[tuple[str, int], int] = {}
    keys = []
    for topic in body.topics:
        for part in topic.partitions:
            key = (topic.name, part.partition_index)
            if not ctx.access.may(topic.name, Operation.SUBSCRIBE):
                codes[key] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif not empty:
                codes[key] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                keys.append(key)
    if keys:
        result = await ctx.offsets.delete(group, keys)
        codes.update(dict.fromkeys(keys, result))
    return OffsetDeleteResponse(topics=[
        OffsetDeleteResponseTopic(topic.name, [
            OffsetDeleteResponsePartition(p.partition_index,
                                          codes[(topic.name, p.partition_index)])
            for p in topic.partitions])
        for topic in body.topics])
