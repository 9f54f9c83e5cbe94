"""The librdkafka configurations of the upstream-Kafka backend, made from the settings.

Everything figtank decides about its clients is here, in one place: the idempotent
producer with ``acks=all``, readers that never join or commit to a group, no topic
auto-creation by the clients (figtank's own policy decides, through the admin client),
librdkafka's own log muted (figtank logs the upstream's state changes itself), then the
security to the upstream and last the pass-through table, which wins.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Final

from gateway.extras import require
from gateway.server.config import Settings

#: The group id librdkafka's consumer insists on; figtank never joins it nor commits
#: (reads assign and seek).
READER_GROUP: Final = "figtank-gateway-readers"


def librdkafka(module: str = "confluent_kafka") -> ModuleType:
    """``confluent_kafka`` (or one of its modules), or
    :class:`~gateway.extras.MissingExtra` naming the extra."""
    return require(module, extra="kafka-upstream", purpose="figtank serve --upstream-kafka")


def common_config(settings: Settings) -> dict[str, Any]:
    """What every client of the upstream shares: servers, client id, security."""
    config: dict[str, Any] = {
        "bootstrap.servers": ",".join(settings.upstream_kafka),
        "client.id": settings.upstream_kafka_client_id,
        "log_level": 0,  # figtank logs the upstream's state; raise it with the table
        "allow.auto.create.topics": False,
    }
    tls = bool(settings.upstream_kafka_tls or settings.upstream_kafka_tls_ca
               or settings.upstream_kafka_tls_cert)
    sasl = bool(settings.upstream_kafka_sasl_mechanism)
    config["security.protocol"] = {(False, False): "plaintext", (True, False): "ssl",
                                   (False, True): "sasl_plaintext",
                                   (True, True): "sasl_ssl"}[tls, sasl]
    if settings.upstream_kafka_tls_ca:
        config["ssl.ca.location"] = settings.upstream_kafka_tls_ca
    if settings.upstream_kafka_tls_cert:
        config["ssl.certificate.location"] = settings.upstream_kafka_tls_cert
        config["ssl.key.location"] = settings.upstream_kafka_tls_key
    if sasl:
        config["sasl.mechanism"] = settings.upstream_kafka_sasl_mechanism
        config["sasl.username"] = settings.upstream_kafka_sasl_username
        config["sasl.password"] = settings.upstream_kafka_sasl_password
    return config


def _with_table(config: dict[str, Any], settings: Settings) -> dict[str, Any]:
    return {**config, **settings.upstream_kafka_librdkafka}


def producer_config(settings: Settings, *, delivery_timeout_ms: int) -> dict[str, Any]:
    """The one producer: idempotent (no duplicates, order kept per partition across
    retries and broker loss), ``acks=all``; a message not acknowledged within
    ``delivery_timeout_ms`` fails (the front end's error, not a hang)."""
    return _with_table({
        **common_config(settings),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 1,
        "message.timeout.ms": delivery_timeout_ms,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1024 * 1024,
    }, settings)


def reader_config(settings: Settings, *, queued_kbytes: int) -> dict[str, Any]:
    """A reader: assigned partitions only, no commits, an out-of-range position reported
    (not reset), the end of a partition reported, ``queued_kbytes`` prefetched at most
    per partition."""
    return _with_table({
        **common_config(settings),
        "group.id": READER_GROUP,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 100,
        "queued.max.messages.kbytes": queued_kbytes,
        # librdkafka pauses a partition's fetches for this long once its local queue
        # holds queued_kbytes, which one fetch response can fill; its default (1 s) held
        # a tail feed to about a queue a second and made history reads wait out their
        # deadline.
        "fetch.queue.backoff.ms": 10,
    }, settings)


def admin_config(settings: Settings) -> dict[str, Any]:
    """The admin client (metadata, topic creation). It is a producer to librdkafka, whose
    Metadata requests for a topic ask the cluster to create it unless
    ``allow.auto.create.topics`` is off (set by :func:`common_config`): with it on, a
    gateway looking a topic up would create it where the cluster auto-creates topics,
    whatever ``topics.auto_create`` says."""
    return _with_table(common_config(settings), settings)
