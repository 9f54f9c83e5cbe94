"""The group requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups,
ListGroups): Kafka's records to and from the
:class:`~gateway.kafka.groups.coordinator.GroupCoordinator`.

A JoinGroup (and a follower's SyncGroup) is a long poll: its handler task waits for the
rebalance, and the connection's later answers wait behind it, as on a Kafka broker.

The access policy's group rules apply (:meth:`~gateway.auth.guard.ConnectionAccess.
may_group`): joining, syncing, heartbeats and leaving need ``subscribe`` on the group,
describing it ``discover``; a refusal is GROUP_AUTHORIZATION_FAILED, and ListGroups lists
only the groups the connection may discover.
"""

from __future__ import annotations

from gateway.auth.policy import Operation
from gateway.kafka.context import RequestContext
from gateway.kafka.groups.coordinator import GroupCoordinator, JoinRequest
from gateway.kafka.groups.state import GroupState
from protocols.kafka.records import (
    DescribedGroup,
    DescribedGroupMember,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    JoinGroupResponseMember,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    MemberResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from protocols.kafka.types import ErrorCode

#: The one group type served (ListGroups version 5).
CLASSIC = "classic"


def _groups(ctx: RequestContext) -> GroupCoordinator:
    assert ctx.groups is not None, "the listener was made without a group coordinator"
    return ctx.groups


def group_allowed(ctx: RequestContext, group: str, operation: Operation,
                  request: str) -> bool:
    """Whether the connection may do ``operation`` on ``group``; a refusal is counted and
    logged (the caller answers GROUP_AUTHORIZATION_FAILED). Always refused where the
    server serves no groups (upstream-Kafka mode)."""
    if ctx.services.groups_refused is not None:
        ctx.refused("kafka_groups_not_served", group=group, request=request,
                    reason=ctx.services.groups_refused)
        ctx.access.count_refusal("group_not_served")
        return False
    if ctx.access.may_group(group, operation):
        return True
    ctx.access.refused_group(group, operation, request)
    return False


async def join_group(ctx: RequestContext, body: JoinGroupRequest,
                     version: int) -> JoinGroupResponse:
    """JoinGroup; waits for the rebalance."""
    if not group_allowed(ctx, body.group_id, Operation.SUBSCRIBE, "join_group"):
        return JoinGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                 protocol_name=None if version >= 7 else "",
                                 member_id=body.member_id)
    result = await _groups(ctx).join(JoinRequest(
        group_id=body.group_id, member_id=body.member_id,
        instance_id=body.group_instance_id, protocol_type=body.protocol_type,
        protocols=[(p.name, p.metadata) for p in body.protocols],
        session_timeout_ms=body.session_timeout_ms,
        rebalance_timeout_ms=body.rebalance_timeout_ms,
        require_known_member_id=version >= 4, client_id=ctx.client_id,
        client_host=ctx.client_host))
    if result.error and result.error != ErrorCode.MEMBER_ID_REQUIRED:
        ctx.refused("kafka_join_group_refused", group=body.group_id,
                    member=body.member_id, error=ErrorCode(result.error).name)
    name = result.protocol_name if result.error == ErrorCode.NONE else None
    return JoinGroupResponse(
        error_code=result.error, generation_id=result.generation,
        protocol_type=result.protocol_type if result.error == ErrorCode.NONE else None,
        protocol_name=name if name is not None or version >= 7 else "",
        leader=result.leader, member_id=result.member_id,
        members=[JoinGroupResponseMember(member_id=m, group_instance_id=i, metadata=meta)
                 for m, i, meta in result.members])


async def sync_group(ctx: RequestContext, body: SyncGroupRequest,
                     version: int) -> SyncGroupResponse:
    """SyncGroup; a member waits for the leader's assignments."""
    if not group_allowed(ctx, body.group_id, Operation.SUBSCRIBE, "sync_group"):
        return SyncGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    result = await _groups(ctx).sync(
        body.group_id, body.generation_id, body.member_id, body.group_instance_id,
        body.protocol_type, body.protocol_name,
        [(a.member_id, a.assignment) for a in body.assignments])
    if result.error:
        ctx.refused("kafka_sync_group_refused", group=body.group_id,
                    member=body.member_id, generation=body.generation_id,
                    error=ErrorCode(result.error).name)
    return SyncGroupResponse(error_code=result.error, protocol_type=result.protocol_type,
                             protocol_name=result.protocol_name,
                             assignment=result.assignment)


async def heartbeat(ctx: RequestContext, body: HeartbeatRequest, version: int) -> HeartbeatResponse:
    """Heartbeat."""
    if not group_allowed(ctx, body.group_id, Operation.SUBSCRIBE, "heartbeat"):
        return HeartbeatResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    return HeartbeatResponse(error_code=_groups(ctx).heartbeat(
        body.group_id, body.generation_id, body.member_id, body.group_instance_id))


async def leave_group(ctx: RequestContext, body: LeaveGroupRequest,
                      version: int) -> LeaveGroupResponse:
    """LeaveGroup: one member (versions 0-2) or several."""
    if not group_allowed(ctx, body.group_id, Operation.SUBSCRIBE, "leave_group"):
        return LeaveGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    members = ([(body.member_id, None)] if version < 3 else
               [(m.member_id, m.group_instance_id) for m in body.members])
    codes = _groups(ctx).leave(body.group_id, members)
    if version < 3:
        return LeaveGroupResponse(error_code=codes[0])
    return LeaveGroupResponse(error_code=ErrorCode.NONE, members=[
        MemberResponse(member_id=m, group_instance_id=i, error_code=code)
        for (m, i), code in zip(members, codes, strict=True)])


async def describe_groups(ctx: RequestContext, body: DescribeGroupsRequest,
                          version: int) -> DescribeGroupsResponse:
    """DescribeGroups; an unknown group is Dead (with no error, as Kafka answers up to
    version 5)."""
    groups = _groups(ctx)
    described = []
    for group_id in body.groups:
        if not group_allowed(ctx, group_id, Operation.DISCOVER, "describe_groups"):
            described.append(DescribedGroup(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                            group_id=group_id))
            continue
        summary = groups.describe(group_id)
        described.append(DescribedGroup(
            error_code=ErrorCode.NONE, group_id=group_id, group_state=summary.state.value,
            protocol_type=summary.protocol_type, protocol_data=summary.protocol,
            members=[DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.instance_id,
                client_id=m.client_id, client_host=m.client_host,
                member_metadata=m.metadata, member_assignment=m.assignment)
                for m in summary.members]))
    return DescribeGroupsResponse(groups=described)


async def list_groups(ctx: RequestContext, body: ListGroupsRequest,
                      version: int) -> ListGroupsResponse:
    """ListGroups, filtered by state (version 4) and type (version 5), and to the groups
    the connection may discover (as Kafka lists those it may describe)."""
    states = {s.lower() for s in body.states_filter} if version >= 4 else set()
    types = {t.lower() for t in body.types_filter} if version >= 5 else set()
    if types and CLASSIC not in types:
        return ListGroupsResponse(error_code=ErrorCode.NONE, groups=[])
    return ListGroupsResponse(error_code=ErrorCode.NONE, groups=[
        ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type,
                    group_state=g.state.value, group_type=CLASSIC)
        for g in _groups(ctx).list()
        if not states or g.state.value.lower() in states
        if g.state is not GroupState.DEAD
        if ctx.access.may_group(g.group_id, Operation.DISCOVER)])
