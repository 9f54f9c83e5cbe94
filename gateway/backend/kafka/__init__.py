"""Upstream-Kafka mode: figtank as a stateless gateway in front of a Kafka cluster.

``figtank serve --upstream-kafka HOST:PORT[,HOST:PORT...]`` (``[upstream_kafka]
bootstrap_servers = [...]`` in the config file) serves every listener (Figg, Tank, Kafka)
from a Kafka-protocol cluster (Kafka, Redpanda, another figtank's Kafka listener) through
librdkafka (confluent-kafka, the ``kafka-upstream`` extra). The listeners see a
:class:`KafkaBackend` behind the usual :class:`~gateway.backend.contract.Backend`.

- :mod:`gateway.backend.kafka.clients`: the librdkafka configurations (idempotent producer,
  ``acks=all``, readers that assign and seek, security, the pass-through table);
- :mod:`gateway.backend.kafka.health`: whether the upstream answers, logged per change;
- :mod:`gateway.backend.kafka.produce`: the producer, its reports brought into trio;
- :mod:`gateway.backend.kafka.feeds`: one tail read per partition shared by its readers;
- :mod:`gateway.backend.kafka.history`: reads away from the tail;
- :mod:`gateway.backend.kafka.backend`: the backend itself;
- :mod:`protocols.kafka.upstream`: records <-> bundles (sans-IO).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import structlog
import trio

from gateway.backend.kafka.backend import KafkaBackend, UpstreamUnavailable
from gateway.backend.kafka.clients import (
    admin_config,
    librdkafka,
    producer_config,
    reader_config,
)
from gateway.backend.kafka.feeds import TailFeeds
from gateway.backend.kafka.health import UpstreamHealth
from gateway.backend.kafka.history import HistoryReader
from gateway.backend.kafka.produce import UpstreamProducer
from gateway.client.lone import raise_lone
from gateway.server.config import Settings
from gateway.server.metrics import Metrics

__all__ = ["KafkaBackend", "UpstreamUnavailable", "open_kafka_backend"]

log = structlog.get_logger("figtank.upstream_kafka")

#: How long a message may wait for the upstream's acknowledgement (librdkafka's
#: message.timeout.ms; the pass-through table may change it).
DELIVERY_TIMEOUT_MS = 10_000
#: Seconds the producer gets to deliver what it holds when the backend closes outside a
#: graceful stop (a graceful stop gives it what is left of the grace period).
FLUSH_SECS = 5.0


@asynccontextmanager
async def open_kafka_backend(settings: Settings, metrics: Metrics | None = None, *,
                             wait_secs: float | None = None, probe_interval: float = 5.0,
                             feed_idle_secs: float = 30.0,
                             flush_deadline: Callable[[], float | None] | None = None
                             ) -> AsyncIterator[KafkaBackend]:
    """Serve ``settings.upstream_kafka`` as a backend for the block.

    Returns after the first probe of the upstream whether or not it answered (the gateway
    starts, not ready, and serves once the upstream answers). On exit the producer
    delivers what it still holds until ``flush_deadline()`` (the end of the server's
    grace period, trio time), or for :data:`FLUSH_SECS` when that gives None; with nothing
    in flight it closes at once. Messages it then still holds were never acknowledged to
    a client (a front end answers only after the upstream did).
    """
    ck = librdkafka()
    admin_module = librdkafka("confluent_kafka.admin")
    token = trio.lowlevel.current_trio_token()
    health_box: list[UpstreamHealth] = []

    def on_error(error: Any) -> None:  # librdkafka's thread: report, never raise
        name = error.name()
        if name in ("_ALL_BROKERS_DOWN", "_AUTHENTICATION", "_TRANSPORT", "_SSL") \
                and health_box:
            health = health_box[0]
            with suppress(trio.RunFinishedError):
                if name in ("_AUTHENTICATION", "_SSL"):
                    token.run_sync_soon(health.refused, error.str())
                else:
                    token.run_sync_soon(health.suspect)
        if error.fatal():
            log.error("upstream_client_fatal", error=error.name(), reason=error.str())

    common = {"error_cb": on_error}
    admin = admin_module.AdminClient({**admin_config(settings), **common})
    producer_handle = ck.Producer({**producer_config(
        settings, delivery_timeout_ms=DELIVERY_TIMEOUT_MS), **common})
    max_message = int(settings.upstream_kafka_librdkafka.get("message.max.bytes", 1_000_000))
    producer = UpstreamProducer(producer_handle, token, metrics=metrics,
                                max_message_bytes=max_message)
    tail_kbytes = max(settings.tail_cache_bytes // 1024 // 16, 256)
    feeds = TailFeeds(ck.Consumer({**reader_config(settings, queued_kbytes=tail_kbytes),
                                   **common}),
                      ck.TopicPartition, token, cache_bytes=max(
                          settings.tail_cache_bytes // 16, 256 * 1024),
                      idle_secs=feed_idle_secs, metrics=metrics)
    history = HistoryReader(lambda: ck.Consumer({**reader_config(settings, queued_kbytes=1024),
                                                 **common}), ck.TopicPartition)
    meta = ck.Consumer({**reader_config(settings, queued_kbytes=64), **common})
    health = UpstreamHealth(lambda timeout: admin.list_topics(timeout=timeout),
                            settings.upstream_kafka,
                            metrics=metrics, interval=probe_interval)
    health_box.append(health)
    backend = KafkaBackend(ck=ck, admin=admin, meta=meta, producer=producer, feeds=feeds,
                           history=history, health=health,
                           auto_create_topics=settings.auto_create_topics,
                           default_partitions=settings.default_partitions,
                           max_bundle_bytes=settings.max_bundle_bytes,
                           wait_secs=(settings.upstream_wait_secs if wait_secs is None
                                      else wait_secs),
                           metrics=metrics)
    try:
        try:
            async with trio.open_nursery() as nursery:
                backend._spawn = nursery.start_soon
                await nursery.start(health.run)
                nursery.start_soon(feeds.expire)
                try:
                    yield backend
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise_lone(group)
    finally:
        with trio.CancelScope(shield=True):
            left = await trio.to_thread.run_sync(producer.close,
                                                 _flush_secs(flush_deadline))
            if left:
                log.warning("upstream_unacknowledged_at_stop", messages=left)
            await trio.to_thread.run_sync(_close_readers, feeds, history, meta)


def _flush_secs(deadline: Callable[[], float | None] | None) -> float:
    """How long the producer may flush: until the deadline, else :data:`FLUSH_SECS`."""
    at = deadline() if deadline is not None else None
    if at is None:
        return FLUSH_SECS
    return max(0.0, at - trio.current_time())


def _close_readers(feeds: TailFeeds, history: HistoryReader, meta: Any) -> None:
    feeds.close()
    history.close()
    meta.close()
