"""What the Kafka listener is configured with (:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.core.config import ListenerTable, Settings
from gateway.core.sections import Section, setting

__all__ = ["KafkaSettings"]


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
    #: The SASL mechanisms connections must authenticate with (empty: no SASL): the
    #: listener's own ``[listeners.NAME]`` table's.
    sasl_mechanisms: tuple[str, ...] = ()

    @classmethod
    def derived(cls, settings: Settings, listener: str | None) -> dict[str, Any]:
        """The SASL mechanisms of ``listener`` (the listener named kafka when None)."""
        table = settings.listeners.get(listener or "kafka", ListenerTable())
        return {"sasl_mechanisms": table.sasl_mechanisms}

