"""The group coordinator over raw Kafka requests: Kafka's error codes for bad joins,
stale generations and unknown members, rebalances, static members, the limits, and the
interface the committed offsets use (check_member, is_empty, KnownGroups)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from gateway.server.run import ServerInfo
from protocols.kafka.records import (
    DescribeGroupsRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    ListGroupsRequest,
    MemberIdentity,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
)
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import kafka_server
from tests.kafka.raw import call

E = ErrorCode
FAST = {"group_min_session_timeout_ms": 100, "group_initial_rebalance_delay_ms": 0}


@asynccontextmanager
async def server_for(tmp_path: Any, **settings: Any) -> AsyncIterator[ServerInfo]:
    async with kafka_server(tmp_path, **{**FAST, **settings}) as server:
        yield server


async def connect(server: ServerInfo) -> trio.SocketStream:
    assert server.kafka is not None
    return await trio.open_tcp_stream(*server.kafka)


def join_body(group: str = "g", member: str = "", *, instance: str | None = None,
              session: int = 10_000, rebalance: int = 2_000, ptype: str = "consumer",
              protocols: tuple[tuple[str, bytes], ...] = (("range", b"meta"),)) -> Any:
    return JoinGroupRequest(
        group_id=group, session_timeout_ms=session, rebalance_timeout_ms=rebalance,
        member_id=member, group_instance_id=instance, protocol_type=ptype,
        protocols=[JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols],
        reason=None)


async def join(stream: trio.SocketStream, version: int = 5, **kw: Any) -> Any:
    return (await call(stream, ApiKey.JOIN_GROUP, version, join_body(**kw)))[1]


async def join_member(stream: trio.SocketStream, **kw: Any) -> Any:
    """A v5 join through MEMBER_ID_REQUIRED: the member's join answer."""
    first = await join(stream, **kw)
    assert first.error_code == E.MEMBER_ID_REQUIRED and first.member_id
    return await join(stream, member=first.member_id, **kw)


async def sync(stream: trio.SocketStream, member: str, generation: int,
               assignments: dict[str, bytes] | None = None, group: str = "g") -> Any:
    body = SyncGroupRequest(
        group_id=group, generation_id=generation, member_id=member, group_instance_id=None,
        protocol_type=None, protocol_name=None, assignments=[
            SyncGroupRequestAssignment(member_id=m, assignment=a)
            for m, a in (assignments or {}).items()])
    return (await call(stream, ApiKey.SYNC_GROUP, 3, body))[1]


async def heartbeat(stream: trio.SocketStream, member: str, generation: int,
                    group: str = "g", instance: str | None = None) -> int:
    body = HeartbeatRequest(group_id=group, generation_id=generation, member_id=member,
                            group_instance_id=instance)
    return int((await call(stream, ApiKey.HEARTBEAT, 4, body))[1].error_code)


def limit_hits(server: ServerInfo, limit: str) -> float:
    return float(server.metrics_registry.limit_hits.labels(limit)._value.get())


async def test_join_sync_heartbeat_and_fencing(tmp_path):
    async with server_for(tmp_path) as server:
        s = await connect(server)
        joined = await join_member(s)
        assert (joined.error_code, joined.generation_id, joined.protocol_name) == (0, 1, "range")
        me = joined.member_id
        assert joined.leader == me and [m.member_id for m in joined.members] == [me]
        assert [m.metadata for m in joined.members] == [b"meta"]
        synced = await sync(s, me, 1, {me: b"assignment"})
        assert (synced.error_code, synced.assignment) == (0, b"assignment")
        assert await heartbeat(s, me, 1) == E.NONE
        assert await heartbeat(s, me, 7) == E.ILLEGAL_GENERATION
        assert await heartbeat(s, "bogus", 1) == E.UNKNOWN_MEMBER_ID
        assert await heartbeat(s, me, 1, group="nope") == E.UNKNOWN_MEMBER_ID
        assert (await sync(s, me, 0)).error_code == E.ILLEGAL_GENERATION
        assert (await sync(s, "bogus", 1)).error_code == E.UNKNOWN_MEMBER_ID
        assert (await join(s, member="bogus")).error_code == E.UNKNOWN_MEMBER_ID
        assert (await join(s, group="new", member="bogus")).error_code == E.UNKNOWN_MEMBER_ID
        # a follower with no change gets the current generation back, without a rebalance
        groups = server.groups
        assert groups is not None
        assert groups.check_member("g", me, 1, None) == E.NONE
        assert groups.check_member("g", me, 0, None) == E.ILLEGAL_GENERATION
        assert groups.check_member("g", "bogus", 1, None) == E.UNKNOWN_MEMBER_ID
        assert groups.check_member("g", "", -1, None) == E.UNKNOWN_MEMBER_ID
        assert groups.check_member("other", "", -1, None) == E.NONE
        assert groups.check_member("other", "m", 3, None) == E.ILLEGAL_GENERATION
        assert not groups.is_empty("g") and groups.is_empty("other")


async def test_bad_joins_get_kafka_error_codes(tmp_path):
    async with server_for(tmp_path, group_min_session_timeout_ms=1000,
                          group_max_session_timeout_ms=5000) as server:
        s = await connect(server)
        assert (await join(s, session=999)).error_code == E.INVALID_SESSION_TIMEOUT
        assert (await join(s, session=5001)).error_code == E.INVALID_SESSION_TIMEOUT
        assert (await join(s, group="")).error_code == E.INVALID_GROUP_ID
        assert (await join(s, session=2000, protocols=())).error_code == \
            E.INCONSISTENT_GROUP_PROTOCOL
        await join_member(s, session=2000)
        other = await connect(server)
        assert (await join(other, session=2000, ptype="connect")).error_code == \
            E.INCONSISTENT_GROUP_PROTOCOL
        assert (await join(other, session=2000, protocols=(("roundrobin", b""),))
                ).error_code == E.INCONSISTENT_GROUP_PROTOCOL
        # version 3 has no MEMBER_ID_REQUIRED step: a member id at once
        async with trio.open_nursery() as nursery:
            async def v3() -> None:
                answer = await join(other, version=3, session=2000)
                assert answer.error_code == E.NONE and answer.member_id
            nursery.start_soon(v3)
            await trio.sleep(0.2)
            # the first member rejoins (its heartbeat says a rebalance is under way)
            assert await heartbeat(s, server.groups._groups["g"].leader, 1) == \
                E.REBALANCE_IN_PROGRESS  # type: ignore[union-attr]
            leader = server.groups._groups["g"].leader  # type: ignore[union-attr]
            again = await join(s, member=leader, session=2000)
            assert again.error_code == E.NONE and again.generation_id == 2
            assert len(again.members) == 2


async def test_rebalance_protocol_choice_and_drop_of_members_not_rejoining(tmp_path):
    async with server_for(tmp_path) as server:
        a, b = await connect(server), await connect(server)
        first = await join_member(a, rebalance=500, protocols=(("range", b"A"),
                                                               ("roundrobin", b"a")))
        me = first.member_id
        result: dict[str, Any] = {}

        async def second() -> None:
            result["b"] = await join_member(b, rebalance=500, protocols=(
                ("roundrobin", b"b"), ("range", b"B")))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.sleep(0.1)
            again = await join(a, member=me, rebalance=500, protocols=(
                ("range", b"A"), ("roundrobin", b"a")))
        # one vote each: the leader's order decides
        assert again.protocol_name == result["b"].protocol_name == "range"
        assert again.generation_id == 2 and again.leader == me
        assert sorted(m.metadata for m in again.members) == [b"A", b"B"]
        assert result["b"].members == []
        # b rejoins with new metadata (a rebalance), a does not: after the rebalance
        # timeout a is dropped
        with trio.fail_after(3):
            alone = await join(b, member=result["b"].member_id, rebalance=500,
                               protocols=(("roundrobin", b"b2"), ("range", b"B2")))
        assert alone.generation_id == 3 and alone.leader == result["b"].member_id
        assert alone.protocol_name == "roundrobin"
        assert await heartbeat(a, me, 3) == E.UNKNOWN_MEMBER_ID


async def test_leave_batch_static_members_and_describe(tmp_path):
    async with server_for(tmp_path) as server:
        s = await connect(server)
        static = await join(s, instance="i-1")  # static members get their id at once
        assert static.error_code == E.NONE
        old = static.member_id
        await sync(s, old, 1, {old: b"x"})
        described = (await call(s, ApiKey.DESCRIBE_GROUPS, 5, DescribeGroupsRequest(
            groups=["g", "none"], include_authorized_operations=False)))[1].groups
        assert [(g.group_id, g.group_state, g.protocol_data) for g in described] == [
            ("g", "Stable", "range"), ("none", "Dead", "")]
        assert [(m.member_id, m.group_instance_id, m.member_assignment)
                for m in described[0].members] == [(old, "i-1", b"x")]
        assert described[0].members[0].client_host == "/127.0.0.1"
        listed = (await call(s, ApiKey.LIST_GROUPS, 4, ListGroupsRequest(
            states_filter=["stable"], types_filter=[])))[1].groups
        assert [(g.group_id, g.group_state) for g in listed] == [("g", "Stable")]
        # the instance restarts: a new member id; the old one is fenced
        s2 = await connect(server)
        new = await join(s2, instance="i-1")
        assert new.error_code == E.NONE and new.member_id != old
        assert await heartbeat(s, old, 2, instance="i-1") == E.FENCED_INSTANCE_ID
        assert server.groups is not None
        assert server.groups.check_member("g", old, 2, "i-1") == E.FENCED_INSTANCE_ID
        leave = (await call(s2, ApiKey.LEAVE_GROUP, 3, LeaveGroupRequest(
            group_id="g", member_id="", members=[
                MemberIdentity(member_id="", group_instance_id="i-1", reason=None),
                MemberIdentity(member_id="bogus", group_instance_id=None, reason=None)])))[1]
        assert [m.error_code for m in leave.members] == [E.NONE, E.UNKNOWN_MEMBER_ID]
        assert server.groups.is_empty("g")
        legacy = (await call(s2, ApiKey.LEAVE_GROUP, 1, LeaveGroupRequest(
            group_id="g", member_id="bogus", members=[])))[1]
        assert legacy.error_code == E.UNKNOWN_MEMBER_ID


async def test_session_timeout_removes_a_silent_member(tmp_path):
    async with server_for(tmp_path) as server:
        s = await connect(server)
        joined = await join_member(s, session=300)
        await sync(s, joined.member_id, 1, {joined.member_id: b""})
        await trio.sleep(0.6)
        assert await heartbeat(s, joined.member_id, 1) == E.UNKNOWN_MEMBER_ID
        assert server.groups is not None and server.groups.is_empty("g")
        assert server.metrics_registry.kafka_group_rebalances.labels(
            "session_timeout")._value.get() == 1


async def test_known_groups_are_listed_empty(tmp_path):
    class Offsets:
        def groups(self) -> list[str]:
            return ["committed-only"]

        def has_group(self, group: str) -> bool:
            return group == "committed-only"

    async with server_for(tmp_path) as server:
        assert server.groups is not None
        server.groups.known = Offsets()
        s = await connect(server)
        listed = (await call(s, ApiKey.LIST_GROUPS, 4, ListGroupsRequest(
            states_filter=[], types_filter=[])))[1].groups
        assert [(g.group_id, g.group_state) for g in listed] == [("committed-only", "Empty")]
        described = (await call(s, ApiKey.DESCRIBE_GROUPS, 0, DescribeGroupsRequest(
            groups=["committed-only"], include_authorized_operations=False)))[1].groups
        assert described[0].group_state == "Empty"


async def test_limits_groups_members_and_bytes(tmp_path):
    async with server_for(tmp_path, max_groups=1, max_group_members=2,
                          max_group_member_bytes=1000, max_group_bytes=1500) as server:
        s = await connect(server)
        assert (await join(s)).error_code == E.MEMBER_ID_REQUIRED
        assert (await join(s)).error_code == E.MEMBER_ID_REQUIRED
        # a flood of first joins: ids handed out count, the third is refused
        assert (await join(s)).error_code == E.GROUP_MAX_SIZE_REACHED
        assert limit_hits(server, "groups.max_members") == 1
        assert (await join(s, group="g2")).error_code == E.COORDINATOR_NOT_AVAILABLE
        assert limit_hits(server, "groups.max_groups") == 1
        big = (("range", b"x" * 1000),)
        pending = server.groups._groups["g"].pending  # type: ignore[union-attr]
        ids = list(pending)
        assert (await join(s, member=ids[0], protocols=big)).error_code == \
            E.GROUP_MAX_SIZE_REACHED
        assert limit_hits(server, "groups.max_member_bytes") == 1
        async with trio.open_nursery() as nursery:
            async def first() -> None:
                answer = await join(s, member=ids[0], protocols=(("range", b"x" * 800),))
                assert answer.error_code == E.NONE
            nursery.start_soon(first)
            await trio.sleep(0.1)
            other = await connect(server)
            answer = await join(other, member=ids[1], protocols=(("range", b"y" * 800),))
            assert answer.error_code == E.GROUP_MAX_SIZE_REACHED
            assert limit_hits(server, "groups.max_bytes") == 1
            await leave_all(other, ids[1])


async def leave_all(stream: trio.SocketStream, member: str) -> None:
    await call(stream, ApiKey.LEAVE_GROUP, 3, LeaveGroupRequest(
        group_id="g", member_id="", members=[
            MemberIdentity(member_id=member, group_instance_id=None, reason=None)]))
