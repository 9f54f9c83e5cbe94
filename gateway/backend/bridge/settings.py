"""What the bridge backend is configured with (:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.sections import Section, setting

__all__ = ["BridgeSettings"]


@dataclass(frozen=True, slots=True)
class BridgeSettings(Section):
    """The bridge backend's settings: the upstream Tank brokers, how long a request
    waits for them, and the topics' defaults."""

    brokers: tuple[str, ...] = setting("upstream.brokers")
    wait_secs: float = setting("upstream.wait_secs")
    auto_create_topics: bool = setting("topics.auto_create")
    default_partitions: int = setting("topics.default_partitions")
    topic_config: dict[str, str] = setting("topics.config")
    max_bundle_bytes: int = setting("store.max_bundle_bytes")
