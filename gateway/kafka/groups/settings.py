"""What the consumer groups' coordinator is configured with (:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.sections import Section, setting

__all__ = ["GroupSettings"]


@dataclass(frozen=True, slots=True)
class GroupSettings(Section):
    """The consumer groups' coordinator's bounds and timing (``groups.*``)."""

    initial_rebalance_delay_ms: int = setting("groups.initial_rebalance_delay_ms")
    min_session_timeout_ms: int = setting("groups.min_session_timeout_ms")
    max_session_timeout_ms: int = setting("groups.max_session_timeout_ms")
    max_groups: int = setting("groups.max_groups")
    max_members: int = setting("groups.max_members")
    max_member_bytes: int = setting("groups.max_member_bytes")
    max_bytes: int = setting("groups.max_bytes")
