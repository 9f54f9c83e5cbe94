"""What the upstream-Kafka backend is configured with (:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.sections import Section, setting

__all__ = ["UpstreamKafkaSettings"]


@dataclass(frozen=True, slots=True)
class UpstreamKafkaSettings(Section):
    """The upstream-Kafka backend's settings: the cluster (``upstream_kafka.*``), how long
    a request waits for it, the topics' defaults and the memory of its feeds."""

    bootstrap_servers: tuple[str, ...] = setting("upstream_kafka.bootstrap_servers")
    client_id: str = setting("upstream_kafka.client_id")
    tls: bool = setting("upstream_kafka.tls")
    tls_ca: str = setting("upstream_kafka.tls_ca")
    tls_cert: str = setting("upstream_kafka.tls_cert")
    tls_key: str = setting("upstream_kafka.tls_key")
    sasl_mechanism: str = setting("upstream_kafka.sasl_mechanism")
    sasl_username: str = setting("upstream_kafka.sasl_username")
    sasl_password: str = setting("upstream_kafka.sasl_password")
    compression: str = setting("upstream_kafka.compression")
    max_batch_bytes: int = setting("upstream_kafka.max_batch_bytes")
    read_ahead: int = setting("upstream_kafka.read_ahead")
    delivery_timeout_secs: float = setting("upstream_kafka.delivery_timeout_secs")
    wait_secs: float = setting("upstream.wait_secs")
    auto_create_topics: bool = setting("topics.auto_create")
    default_partitions: int = setting("topics.default_partitions")
    max_bundle_bytes: int = setting("store.max_bundle_bytes")
    #: A 16th of it (256 KiB at least) bounds the feeds' cache of the newest batches.
    tail_cache_bytes: int = setting("store.tail_cache_bytes")
