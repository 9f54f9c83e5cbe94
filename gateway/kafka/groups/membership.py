"""What the committed offsets need to know of a group's members.

The group coordinator answers these two questions; until one is wired in,
:class:`NoMembers` stands in for it: every group is empty, so only standalone commits
(generation -1, the way ``assign()`` + ``commit()`` clients and tools commit) are
accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from protocols.kafka.types import ErrorCode


class MembershipCheck(Protocol):
    """The group coordinator, as the offset requests see it."""

    def check_member(self, group_id: str, member_id: str, generation_id: int,
                     group_instance_id: str | None) -> int:
        """The Kafka error code an OffsetCommit of this member gets (``ErrorCode.NONE``:
        it may commit): standalone commits (generation < 0) only while the group is
        empty; else UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID or
        REBALANCE_IN_PROGRESS as Kafka's classic coordinator answers."""
        ...

    def is_empty(self, group_id: str) -> bool:
        """Whether the group has no member (OffsetDelete and ``figtank groups reset``
        are refused otherwise)."""
        ...


class NoMembers:
    """The stand-in coordinator: no group has members. ``known(group)``: whether the
    group exists (has committed offsets), which decides between UNKNOWN_MEMBER_ID (an
    empty group) and ILLEGAL_GENERATION (no such group), as Kafka answers."""

    def __init__(self, known: Callable[[str], bool]) -> None:
        self._known = known

    def check_member(self, group_id: str, member_id: str, generation_id: int,
                     group_instance_id: str | None) -> int:
        if generation_id < 0:
            return ErrorCode.NONE
        if self._known(group_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.ILLEGAL_GENERATION

    def is_empty(self, group_id: str) -> bool:
        return True
