"""The group coordinator of Kafka's classic group protocol, one for the whole server.

A group goes Empty -> PreparingRebalance (members (re)join; each JoinGroup waits) ->
CompletingRebalance (every waiting JoinGroup is answered with the new generation; the
leader also gets every member's metadata and runs the client-side assignor) -> Stable
(the leader's SyncGroup carries every member's assignment, handed to each member's
SyncGroup untouched). A member joining, changing its protocols, leaving or expiring sends
a Stable group back to PreparingRebalance; Heartbeat then answers REBALANCE_IN_PROGRESS
so the others rejoin. Kafka's fencing rules apply: stale generations are
ILLEGAL_GENERATION, unknown members UNKNOWN_MEMBER_ID, a static member replaced by a newer
instance FENCED_INSTANCE_ID.

Timers are deadlines in one heap served by :meth:`GroupCoordinator.run`, a single task in
the server's nursery: a member's session timeout, a rebalance's end (the initial delay of
an empty group, ``groups.initial_rebalance_delay_ms``, or the members' rebalance
timeout), the wait for SyncGroup, and the lapse of member ids handed out but never
joined. Groups without members are forgotten (their committed offsets, kept elsewhere,
still list them through :class:`~gateway.kafka.groups.state.KnownGroups`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog
import trio

from gateway.core.metrics import Metrics
from gateway.kafka.groups.settings import GroupSettings
from gateway.kafka.groups.state import (
    Group,
    GroupState,
    JoinResult,
    KnownGroups,
    Member,
    Reply,
    SyncResult,
)
from gateway.logevery import LogEvery
from protocols.kafka.types import ErrorCode

log = structlog.get_logger("figtank.kafka.groups")

_E = ErrorCode
#: Longest id part a client's own string contributes to a member id.
_CLIENT_ID_CHARS = 64
#: The timer heap is never pruned below this size.
_MIN_PRUNE = 256


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """A JoinGroup, as the coordinator needs it."""

    group_id: str
    member_id: str
    instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    #: Version 4 and later: a first join is answered MEMBER_ID_REQUIRED with its id.
    require_known_member_id: bool
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class MemberSummary:
    """One member as DescribeGroups shows it."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One group as DescribeGroups and ListGroups show it."""

    group_id: str
    state: GroupState
    protocol_type: str
    protocol: str
    members: list[MemberSummary] = field(default_factory=list)


class GroupCoordinator:
    """Every consumer group of the server. Start :meth:`run` in a nursery for the
    timers; the request handlers call :meth:`join`, :meth:`sync`, :meth:`heartbeat`,
    :meth:`leave`, :meth:`describe` and :meth:`list`; the offsets' handlers call
    :meth:`check_member` and :meth:`is_empty`."""

    def __init__(self, settings: GroupSettings, metrics: Metrics, *,
                 known: KnownGroups | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        #: Groups known from their committed offsets (listed as Empty when memberless).
        self.known = known
        self._groups: dict[str, Group] = {}
        self._timers: list[tuple[float, int, str, str, str]] = []
        self._seq = itertools.count()
        self._wake = trio.Event()
        #: Client-chosen bytes held by every member of every group.
        self._bytes = 0
        #: The heap is rebuilt without stale entries when it grows past this.
        self._prune_at = _MIN_PRUNE
        #: When each limit's warning was last logged (trio clock).
        self._log_every = LogEvery()

    # ----------------------------------------------------------------------- timers

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve the deadlines until cancelled."""
        task_status.started()
        while True:
            now = trio.current_time()
            while self._timers and self._timers[0][0] <= now:
                _, _, kind, group_id, key = heapq.heappop(self._timers)
                group = self._groups.get(group_id)
                if group is not None:
                    self._fire(group, kind, key, now)
            when = self._timers[0][0] if self._timers else math.inf
            with trio.move_on_at(when):
                await self._wake.wait()
            self._wake = trio.Event()

    def _at(self, when: float, kind: str, group_id: str, key: str = "") -> None:
        if not self._timers or when < self._timers[0][0]:
            self._wake.set()
        heapq.heappush(self._timers, (when, next(self._seq), kind, group_id, key))
        if len(self._timers) > self._prune_at:
            self._prune()

    def _prune(self) -> None:
        """Drop the timers that can no longer do anything (their member left, their
        member id was given back, their rebalance is over): a join/leave loop would
        otherwise keep one entry per request until its deadline, up to the session or
        rebalance timeout. Amortised: the heap is rebuilt when it doubles."""
        self._timers = [t for t in self._timers if self._live(*t)]
        heapq.heapify(self._timers)
        self._prune_at = max(_MIN_PRUNE, 2 * len(self._timers))
        self._wake.set()

    def _live(self, when: float, _seq: int, kind: str, group_id: str, key: str) -> bool:
        group = self._groups.get(group_id)
        if group is None:
            return False
        if kind == "member":
            member = group.members.get(key)
            return member is not None and member.timer_at == when
        if kind == "pending":
            return group.pending.get(key) == when
        if kind == "join":
            return group.state is GroupState.PREPARING_REBALANCE and group.deadline == when
        return (group.state is GroupState.COMPLETING_REBALANCE
                and key == str(group.generation))

    def _touch(self, member: Member, group: Group) -> None:
        """Heard from ``member``: its session starts again."""
        member.expires_at = trio.current_time() + member.session_timeout
        if member.timer_at is None:
            member.timer_at = member.expires_at
            self._at(member.expires_at, "member", group.group_id, member.member_id)

    def _fire(self, group: Group, kind: str, key: str, now: float) -> None:
        if kind == "member":
            member = group.members.get(key)
            if member is None:
                return
            member.timer_at = None
            if member.busy:
                member.expires_at = max(member.expires_at, now + member.session_timeout)
            if member.expires_at > now:
                member.timer_at = member.expires_at
                self._at(member.expires_at, "member", group.group_id, key)
                return
            log.info("kafka_group_member_expired", group=group.group_id, member=key,
                     session_timeout_ms=int(member.session_timeout * 1000))
            self._remove(group, member, "session_timeout", _E.UNKNOWN_MEMBER_ID)
        elif kind == "pending":
            lapse = group.pending.get(key)
            if lapse is not None and lapse <= now:
                del group.pending[key]
                self._maybe_complete_join(group)
                self._maybe_drop(group)
        elif kind == "join":
            if group.state is GroupState.PREPARING_REBALANCE and group.deadline <= now:
                self._complete_join(group)
        elif (kind == "sync" and group.state is GroupState.COMPLETING_REBALANCE
              and group.deadline <= now and str(group.generation) == key):
            late = [m for m in group.members.values() if m.sync_reply is None]
            log.info("kafka_group_sync_timeout", group=group.group_id,
                     generation=group.generation, dropped=[m.member_id for m in late])
            for member in late:
                self._forget(group, member, _E.UNKNOWN_MEMBER_ID)
            self._prepare_rebalance(group, "sync_timeout")
            self._maybe_complete_join(group)

    # -------------------------------------------------------------------- bookkeeping

    def _set_state(self, group: Group, state: GroupState) -> None:
        self.metrics.kafka_groups.labels(group.state.value).dec()
        group.state = state
        self.metrics.kafka_groups.labels(state.value).inc()

    def _new_group(self, group_id: str) -> Group:
        group = self._groups[group_id] = Group(group_id)
        self.metrics.kafka_groups.labels(group.state.value).inc()
        return group

    def _maybe_drop(self, group: Group) -> None:
        """Forget a group with no member and none about to join (once: a group already
        forgotten, e.g. by the join that emptied it, is not counted out again)."""
        if (not group.members and not group.pending and group.state is GroupState.EMPTY
                and self._groups.get(group.group_id) is group):
            self.metrics.kafka_groups.labels(group.state.value).dec()
            self._groups.pop(group.group_id, None)

    def _add(self, group: Group, member: Member) -> None:
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.instances[member.instance_id] = member.member_id
        self._bytes += member.size
        self.metrics.kafka_group_members.inc()

    def _forget(self, group: Group, member: Member, answer: int) -> None:
        """Take ``member`` out of ``group``; its waiting requests get ``answer``."""
        group.members.pop(member.member_id, None)
        if member.instance_id is not None and \
                group.instances.get(member.instance_id) == member.member_id:
            del group.instances[member.instance_id]
        self._bytes -= member.size
        self.metrics.kafka_group_members.dec()
        member.answer_join(JoinResult(answer, member.member_id))
        member.answer_sync(SyncResult(answer))
        if group.leader == member.member_id:
            group.leader = None

    def _remove(self, group: Group, member: Member, reason: str, answer: int) -> None:
        """A member left or expired: the group rebalances (Kafka's
        removeMemberAndUpdateGroup)."""
        self._forget(group, member, answer)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason)
        self._maybe_complete_join(group)
        self._maybe_drop(group)

    def _limit(self, limit: str, **what: object) -> None:
        self.metrics.limit_hit(limit)
        if self._log_every.due(limit) is not None:
            log.warning("kafka_group_limit_reached", limit=limit, **what,
                        action="refused (logged once a minute; every hit is counted in "
                        "figtank_limit_hits_total)")

    def _sizes_ok(self, group: Group, old: int, new: int, member_id: str, *,
                  total: int | None = None) -> bool:
        """Whether a member may hold ``new`` bytes instead of ``old`` (``total``: what all
        members would then hold, if not just that change)."""
        if new > self.settings.max_member_bytes:
            self._limit("groups.max_member_bytes", group=group.group_id, member=member_id,
                        bytes=new, max=self.settings.max_member_bytes)
            return False
        total = self._bytes - old + new if total is None else total
        if total > self.settings.max_bytes:
            self._limit("groups.max_bytes", group=group.group_id, member=member_id,
                        bytes=total, max=self.settings.max_bytes)
            return False
        return True

    def _new_member_id(self, request: JoinRequest) -> str:
        prefix = (request.client_id or request.protocol_type or "member")[:_CLIENT_ID_CHARS]
        return f"{prefix}-{uuid.uuid4()}"

    # --------------------------------------------------------------------- rebalances

    def _max_rebalance_timeout(self, group: Group) -> float:
        return max((m.rebalance_timeout for m in group.members.values()), default=0.0)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        """Start a rebalance: members must rejoin."""
        if group.state is GroupState.PREPARING_REBALANCE:
            return
        if group.state is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.answer_sync(SyncResult(_E.REBALANCE_IN_PROGRESS))
        initial = group.state is GroupState.EMPTY
        for member in group.members.values():
            member.awaiting_join = False
        now = trio.current_time()
        timeout = self._max_rebalance_timeout(group)
        if initial:
            delay = self.settings.initial_rebalance_delay_ms / 1000
            group.initial_until = now + timeout
            group.deadline = now + min(delay, timeout)
        else:
            group.initial_until = None
            group.deadline = now + timeout
        self._set_state(group, GroupState.PREPARING_REBALANCE)
        self._at(group.deadline, "join", group.group_id)
        self.metrics.kafka_group_rebalances.labels(reason).inc()
        log.info("kafka_group_rebalance", group=group.group_id, reason=reason,
                 generation=group.generation, members=len(group.members))

    def _new_member_joined(self, group: Group) -> None:
        """In the initial delay each new member pushes the end by the delay (Kafka's
        InitialDelayedJoin), never past the rebalance timeout."""
        if group.initial_until is not None:
            delay = self.settings.initial_rebalance_delay_ms / 1000
            group.deadline = min(trio.current_time() + delay, group.initial_until)
            self._at(group.deadline, "join", group.group_id)

    def _maybe_complete_join(self, group: Group) -> None:
        if (group.state is GroupState.PREPARING_REBALANCE and group.initial_until is None
                and not group.pending
                and all(m.awaiting_join for m in group.members.values())):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """The rebalance's join phase ends: drop who did not rejoin, start the next
        generation and answer every waiting JoinGroup."""
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info("kafka_group_member_dropped", group=group.group_id,
                     member=member.member_id, reason="not rejoined within the rebalance "
                     "timeout")
            self._forget(group, member, _E.UNKNOWN_MEMBER_ID)
        group.initial_until = None
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.leader = None
            self._set_state(group, GroupState.EMPTY)
            self._maybe_drop(group)
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol_name = group.select_protocol()
        self._set_state(group, GroupState.COMPLETING_REBALANCE)
        now = trio.current_time()
        group.deadline = now + self._max_rebalance_timeout(group)
        self._at(group.deadline, "sync", group.group_id, str(group.generation))
        for member in group.members.values():
            member.awaiting_join = False
            self._bytes -= len(member.assignment)
            member.assignment = b""
            self._touch(member, group)
            member.answer_join(self._join_result(group, member))
        log.info("kafka_group_joined", group=group.group_id, generation=group.generation,
                 protocol=group.protocol_name, leader=group.leader,
                 members=len(group.members))

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        protocol = group.protocol_name or ""
        members = ([(m.member_id, m.instance_id, m.metadata(protocol))
                    for m in group.members.values()]
                   if member.member_id == group.leader else [])
        return JoinResult(_E.NONE, member.member_id, group.generation, group.protocol_type,
                          group.protocol_name, group.leader or "", members)

    # ---------------------------------------------------------------------- JoinGroup

    async def join(self, request: JoinRequest) -> JoinResult:
        """A JoinGroup: answered at once (an error, MEMBER_ID_REQUIRED, or the current
        generation to a member whose join changes nothing) or when the rebalance's join
        phase completes."""
        reply = self._join(request)
        if isinstance(reply, JoinResult):
            return reply
        try:
            return await reply.wait()
        finally:
            if not reply.is_set:  # the connection went away: the member may expire
                group = self._groups.get(request.group_id)
                for member in group.members.values() if group else ():
                    if member.join_reply is reply:
                        member.join_reply = None

    def _join(self, r: JoinRequest) -> JoinResult | Reply[JoinResult]:
        s = self.settings
        if not r.group_id:
            return JoinResult(_E.INVALID_GROUP_ID, r.member_id)
        if not (s.min_session_timeout_ms <= r.session_timeout_ms
                <= s.max_session_timeout_ms):
            return JoinResult(_E.INVALID_SESSION_TIMEOUT, r.member_id)
        if not r.protocol_type or not r.protocols:
            return JoinResult(_E.INCONSISTENT_GROUP_PROTOCOL, r.member_id)
        group = self._groups.get(r.group_id)
        if group is None:
            if r.member_id:
                return JoinResult(_E.UNKNOWN_MEMBER_ID, r.member_id)
            if len(self._groups) >= s.max_groups:
                self._limit("groups.max_groups", group=r.group_id, max=s.max_groups)
                return JoinResult(_E.COORDINATOR_NOT_AVAILABLE)
            group = self._new_group(r.group_id)
        try:
            return self._join_group(group, r)
        finally:
            self._maybe_drop(group)

    def _join_group(self, group: Group, r: JoinRequest) -> JoinResult | Reply[JoinResult]:
        names = {name for name, _ in r.protocols}
        if group.members:
            common = group.candidates(excluding=r.member_id)
            if r.protocol_type != group.protocol_type or (
                    common is not None and not names & common):
                return JoinResult(_E.INCONSISTENT_GROUP_PROTOCOL, r.member_id)
        if not r.member_id or r.member_id in group.pending:
            return self._join_new(group, r)
        code = group.check(r.member_id, r.instance_id)
        if code:
            return JoinResult(code, r.member_id)
        member = group.members[r.member_id]
        changed = member.protocols != r.protocols
        if not changed and (group.state is GroupState.COMPLETING_REBALANCE or (
                group.state is GroupState.STABLE and member.member_id != group.leader)):
            # Nothing changes: the current generation's answer (as Kafka does).
            self._touch(member, group)
            return self._join_result(group, member)
        if not self._update(group, member, r):
            return JoinResult(_E.GROUP_MAX_SIZE_REACHED, r.member_id)
        return self._await_join(group, member, "join")

    def _join_new(self, group: Group, r: JoinRequest) -> JoinResult | Reply[JoinResult]:
        s = self.settings
        known = r.member_id in group.pending
        if not known and r.instance_id is not None and r.instance_id in group.instances:
            # A static member restarted: the new instance replaces (fences) the old.
            old = group.members[group.instances[r.instance_id]]
            log.info("kafka_group_member_fenced", group=group.group_id,
                     member=old.member_id, instance=r.instance_id)
            self._forget(group, old, _E.FENCED_INSTANCE_ID)
            if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                self._prepare_rebalance(group, "join")
        elif not known and len(group.members) + len(group.pending) >= s.max_members:
            self._limit("groups.max_members", group=group.group_id, max=s.max_members)
            return JoinResult(_E.GROUP_MAX_SIZE_REACHED, r.member_id)
        member_id = r.member_id if known else self._new_member_id(r)
        if not known and r.instance_id is None and r.require_known_member_id:
            lapse = trio.current_time() + r.session_timeout_ms / 1000
            group.pending[member_id] = lapse
            self._at(lapse, "pending", group.group_id, member_id)
            return JoinResult(_E.MEMBER_ID_REQUIRED, member_id)
        member = Member(member_id, r.instance_id, r.client_id, r.client_host,
                        r.session_timeout_ms / 1000, self._rebalance_timeout(r), [])
        if not self._sizes_ok(group, 0, member.size + _protocols_size(r.protocols),
                              member_id):
            return JoinResult(_E.GROUP_MAX_SIZE_REACHED, r.member_id)
        member.protocols = list(r.protocols)
        group.pending.pop(member_id, None)
        if not group.members:
            group.protocol_type = r.protocol_type
        self._add(group, member)
        self._touch(member, group)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._new_member_joined(group)
        return self._await_join(group, member, "join")

    @staticmethod
    def _rebalance_timeout(r: JoinRequest) -> float:
        ms = r.rebalance_timeout_ms if r.rebalance_timeout_ms > 0 else r.session_timeout_ms
        return ms / 1000

    def _update(self, group: Group, member: Member, r: JoinRequest) -> bool:
        new = member.size - _protocols_size(member.protocols) + _protocols_size(r.protocols)
        if not self._sizes_ok(group, member.size, new, member.member_id):
            return False
        self._bytes += new - member.size
        member.protocols = list(r.protocols)
        member.session_timeout = r.session_timeout_ms / 1000
        member.rebalance_timeout = self._rebalance_timeout(r)
        member.client_id, member.client_host = r.client_id, r.client_host
        self._touch(member, group)
        return True

    def _await_join(self, group: Group, member: Member, reason: str) -> Reply[JoinResult]:
        reply: Reply[JoinResult] = Reply()
        member.answer_join(JoinResult(_E.REBALANCE_IN_PROGRESS, member.member_id))
        member.join_reply = reply
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, reason)
        member.awaiting_join = True
        self._maybe_complete_join(group)
        return reply

    # ---------------------------------------------------------------------- SyncGroup

    async def sync(self, group_id: str, generation: int, member_id: str,
                   instance_id: str | None, protocol_type: str | None,
                   protocol_name: str | None,
                   assignments: Iterable[tuple[str, bytes]]) -> SyncResult:
        """A SyncGroup: the member's assignment, once the leader has sent them all."""
        group = self._groups.get(group_id)
        if group is None:
            return SyncResult(_E.UNKNOWN_MEMBER_ID)
        code = group.check(member_id, instance_id)
        if code:
            return SyncResult(code)
        if generation != group.generation:
            return SyncResult(_E.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return SyncResult(_E.INCONSISTENT_GROUP_PROTOCOL)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(_E.REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        self._touch(member, group)
        if group.state is GroupState.STABLE:
            return self._sync_result(group, member)
        reply: Reply[SyncResult] = Reply()
        member.answer_sync(SyncResult(_E.REBALANCE_IN_PROGRESS))
        member.sync_reply = reply
        if member_id == group.leader:
            self._assign(group, dict(assignments))
        try:
            return await reply.wait()
        finally:
            if member.sync_reply is reply:
                member.sync_reply = None

    def _assign(self, group: Group, assignments: dict[str, bytes]) -> None:
        """The leader's assignments: kept, handed to every waiting member; the group is
        Stable. Past a byte limit every member is refused and the group rebalances."""
        new = {member_id: assignments.get(member_id, b"") for member_id in group.members}
        total = self._bytes
        for member_id, member in group.members.items():
            size = member.size - len(member.assignment) + len(new[member_id])
            total += len(new[member_id]) - len(member.assignment)
            if not self._sizes_ok(group, member.size, size, member_id, total=total):
                for m in group.members.values():
                    m.answer_sync(SyncResult(_E.GROUP_MAX_SIZE_REACHED))
                self._prepare_rebalance(group, "assignment_refused")
                return
        for member_id, member in group.members.items():
            self._bytes += len(new[member_id]) - len(member.assignment)
            member.assignment = new[member_id]
        self._set_state(group, GroupState.STABLE)
        for member in group.members.values():
            member.answer_sync(self._sync_result(group, member))

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        return SyncResult(_E.NONE, member.assignment, group.protocol_type,
                          group.protocol_name)

    # ------------------------------------------------------------ Heartbeat, LeaveGroup

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  instance_id: str | None) -> int:
        """A Heartbeat's error code."""
        group = self._groups.get(group_id)
        if group is None:
            return _E.UNKNOWN_MEMBER_ID
        code = group.check(member_id, instance_id)
        if code:
            return code
        if generation != group.generation:
            return _E.ILLEGAL_GENERATION
        self._touch(group.members[member_id], group)
        if group.state is GroupState.PREPARING_REBALANCE:
            return _E.REBALANCE_IN_PROGRESS
        return _E.NONE

    def leave(self, group_id: str, members: Iterable[tuple[str, str | None]]) -> list[int]:
        """A LeaveGroup of ``(member id, instance id)`` pairs (the member id may be empty
        when the instance id is given): each one's error code."""
        group = self._groups.get(group_id)
        codes: list[int] = []
        for member_id, instance_id in members:
            if group is None:
                codes.append(_E.UNKNOWN_MEMBER_ID)
                continue
            if instance_id is not None:
                current = group.instances.get(instance_id)
                if current is None:
                    codes.append(_E.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != current:
                    codes.append(_E.FENCED_INSTANCE_ID)
                    continue
                member_id = current
            if member_id in group.pending:
                del group.pending[member_id]
                codes.append(_E.NONE)
                self._maybe_complete_join(group)
                self._maybe_drop(group)
                continue
            member = group.members.get(member_id)
            if member is None:
                codes.append(_E.UNKNOWN_MEMBER_ID)
                continue
            log.info("kafka_group_member_left", group=group_id, member=member_id)
            self._remove(group, member, "leave", _E.UNKNOWN_MEMBER_ID)
            codes.append(_E.NONE)
        return codes

    # ------------------------------------------------------------- for the offsets side

    def check_member(self, group_id: str, member_id: str, generation_id: int,
                     group_instance_id: str | None) -> int:
        """Whether an OffsetCommit from this member may commit: an :class:`ErrorCode`
        (Kafka's rules for classic groups).

        - A group without members: a standalone commit (generation < 0) is NONE; else
          UNKNOWN_MEMBER_ID when the group exists (members gone, or known from its
          committed offsets), ILLEGAL_GENERATION when it does not.
        - generation < 0, empty member id and no instance id: NONE if the group has no
          members (Empty), else UNKNOWN_MEMBER_ID.
        - Otherwise FENCED_INSTANCE_ID (the instance id now has another member id),
          UNKNOWN_MEMBER_ID (not a member), ILLEGAL_GENERATION (not the current
          generation), REBALANCE_IN_PROGRESS (CompletingRebalance: assignments are being
          handed out), else NONE (Stable, or PreparingRebalance: members commit before
          they rejoin); a NONE counts as the member's heartbeat.
        """
        group = self._groups.get(group_id)
        if group is None or not group.members:
            if generation_id < 0:
                return _E.NONE
            if group is None:
                known = self.known is not None and self.known.has_group(group_id)
                return _E.UNKNOWN_MEMBER_ID if known else _E.ILLEGAL_GENERATION
        elif generation_id < 0 and not member_id and group_instance_id is None:
            return _E.UNKNOWN_MEMBER_ID
        code = group.check(member_id, group_instance_id)
        if code:
            return code
        if generation_id != group.generation:
            return _E.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return _E.REBALANCE_IN_PROGRESS
        self._touch(group.members[member_id], group)
        return _E.NONE

    def is_empty(self, group_id: str) -> bool:
        """True when the group has no members and none joining (unknown: True)."""
        group = self._groups.get(group_id)
        return group is None or (not group.members and not group.pending)

    # --------------------------------------------------------------- tools' requests

    def _known(self) -> list[str]:
        if self.known is None:
            return []
        return [g for g in self.known.groups() if g not in self._groups]

    def list(self) -> list[GroupSummary]:
        """Every group: those with members, then those known only from their offsets."""
        listed = [GroupSummary(g.group_id, g.state, g.protocol_type or "",
                               g.protocol_name or "") for g in self._groups.values()]
        listed += [GroupSummary(g, GroupState.EMPTY, "", "") for g in self._known()]
        return listed

    def describe(self, group_id: str) -> GroupSummary:
        """One group; Dead when unknown (as Kafka answers)."""
        group = self._groups.get(group_id)
        if group is None:
            known = self.known is not None and self.known.has_group(group_id)
            return GroupSummary(group_id, GroupState.EMPTY if known else GroupState.DEAD,
                                "", "")
        stable = group.state is GroupState.STABLE
        protocol = group.protocol_name or ""
        members = [MemberSummary(m.member_id, m.instance_id, m.client_id, m.client_host,
                                 m.metadata(protocol) if stable else b"",
                                 m.assignment if stable else b"")
                   for m in group.members.values()]
        shown = protocol if group.state in (GroupState.STABLE,
                                            GroupState.COMPLETING_REBALANCE) else ""
        return GroupSummary(group_id, group.state, group.protocol_type or "", shown,
                            members)


def _protocols_size(protocols: list[tuple[str, bytes]]) -> int:
    return sum(len(name) + len(metadata) for name, metadata in protocols)
