"""What the Kafka listener and its group coordinator are configured with
(:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.config import ListenerTable
from gateway.core.sections import Section, setting

__all__ = ["GroupSettings", "KafkaSettings"]


@dataclass(frozen=True, slots=True)
class KafkaSettings(Section):
    """The Kafka listener's settings (beside the :class:`ConnectionLimits` every listener
    holds)."""

    #: HOST:PORT Metadata names for the listener named kafka (empty: where it is bound).
    advertised: str = setting("listen.kafka_advertised")
    fetch_compression: str = setting("kafka.fetch_compression")
    fetch_compression_topics: dict[str, str] = setting("kafka.fetch_compression_topics")
    response_buffer_bytes: int = setting("limits.response_buffer_bytes")
    sasl_timeout_secs: float = setting("limits.sasl_timeout_secs")
    max_bundle_bytes: int = setting("store.max_bundle_bytes")
    max_producer_states: int = setting("limits.max_producer_states")
    #: The [listeners.NAME] tables: a Kafka listener's SASL mechanisms are in its own.
    listeners: dict[str, ListenerTable] = setting("listeners")


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
