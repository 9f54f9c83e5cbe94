"""What the group coordinator keeps of a group and its members, and the answers it waits
on (no I/O, no timers: :mod:`gateway.kafka.groups.coordinator` drives them)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import trio

from protocols.kafka.types import ErrorCode


class GroupState(enum.Enum):
    """Kafka's states of a classic group (their names are what DescribeGroups says)."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class KnownGroups(Protocol):
    """Groups known from elsewhere (their committed offsets): ListGroups and
    DescribeGroups show those without members as Empty."""

    def groups(self) -> Iterable[str]:
        """The ids of the groups known."""
        ...

    def has_group(self, group: str) -> bool:
        """Whether ``group`` is known."""
        ...


T = TypeVar("T")


class Reply(Generic[T]):
    """An answer a request task waits for; set once."""

    __slots__ = ("_done", "value")

    def __init__(self) -> None:
        self._done = trio.Event()
        self.value: T | None = None

    def set(self, value: T) -> None:
        if not self._done.is_set():
            self.value = value
            self._done.set()

    @property
    def is_set(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> T:
        await self._done.wait()
        assert self.value is not None
        return self.value


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup is answered."""

    error: int
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    #: ``(member id, instance id, metadata)`` of every member, for the leader only.
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a SyncGroup is answered."""

    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class Member:
    """One member of a group."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout: float
    rebalance_timeout: float
    #: ``(name, metadata)`` of each protocol it supports, preferred first.
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    #: Rejoined in the rebalance under way.
    awaiting_join: bool = False
    join_reply: Reply[JoinResult] | None = None
    sync_reply: Reply[SyncResult] | None = None
    #: When it is removed unless heard from (trio clock, seconds).
    expires_at: float = 0.0
    #: When its expiry timer is due (None: none scheduled).
    timer_at: float | None = None

    @property
    def size(self) -> int:
        """Bytes it holds that a client chose (ids, metadata, assignment)."""
        return (len(self.member_id) + len(self.instance_id or "") + len(self.assignment)
                + sum(len(n) + len(m) for n, m in self.protocols))

    @property
    def busy(self) -> bool:
        """A JoinGroup or SyncGroup of it is waiting: it is not expired meanwhile."""
        return ((self.join_reply is not None and not self.join_reply.is_set)
                or (self.sync_reply is not None and not self.sync_reply.is_set))

    def metadata(self, protocol: str) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")

    def answer_join(self, result: JoinResult) -> None:
        if self.join_reply is not None:
            self.join_reply.set(result)
            self.join_reply = None

    def answer_sync(self, result: SyncResult) -> None:
        if self.sync_reply is not None:
            self.sync_reply.set(result)
            self.sync_reply = None


@dataclass(slots=True)
class Group:
    """One group: its state, generation, members and the rebalance under way."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    #: Member ids given by a MEMBER_ID_REQUIRED answer, not joined yet: when they lapse.
    pending: dict[str, float] = field(default_factory=dict)
    #: Static members: instance id -> member id.
    instances: dict[str, str] = field(default_factory=dict)
    #: When the rebalance under way completes at the latest (PreparingRebalance), or when
    #: members that have not sent SyncGroup are dropped (CompletingRebalance).
    deadline: float = 0.0
    #: In the initial delay of an empty group's first rebalance: its end at the latest.
    initial_until: float | None = None

    def candidates(self, excluding: str | None = None) -> set[str] | None:
        """The protocols every member (but ``excluding``) supports (None: no member)."""
        common: set[str] | None = None
        for member_id, member in self.members.items():
            if member_id == excluding:
                continue
            names = {name for name, _ in member.protocols}
            common = names if common is None else common & names
        return common

    def select_protocol(self) -> str:
        """Kafka's choice: among the protocols every member supports, the one most
        members prefer (each votes for its first such); a tie goes to the leader's
        order."""
        common = self.candidates() or set()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next((name for name, _ in member.protocols if name in common), None)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        leader = self.members.get(self.leader or "") or next(iter(self.members.values()))
        order = [name for name, _ in leader.protocols if name in votes]
        if not order:
            return leader.protocols[0][0]
        return max(order, key=lambda name: (votes[name], -order.index(name)))

    def fenced(self, member_id: str, instance_id: str | None) -> bool:
        """A static member's instance id now belongs to another member id."""
        return instance_id is not None and instance_id in self.instances \
            and self.instances[instance_id] != member_id

    def check(self, member_id: str, instance_id: str | None) -> int:
        """FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID, or NONE when the member belongs."""
        if self.fenced(member_id, instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE
