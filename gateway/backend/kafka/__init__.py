"""Upstream-Kafka mode: figtank as a stateless gateway in front of a Kafka cluster.

``figtank serve --upstream-kafka HOST:PORT[,HOST:PORT...]`` (``[upstream_kafka]
bootstrap_servers = [...]`` in the config file) serves every listener (Figg, Tank, Kafka,
HTTP) from a Kafka-protocol cluster (Kafka, Redpanda, Tansu, another figtank's Kafka
listener), speaking Kafka to it with figtank's own protocol layer. The listeners see a
:class:`KafkaBackend` behind the usual :class:`~gateway.core.contract.Backend`.

- :mod:`gateway.backend.kafka.wire`: one pipelined connection to a broker (TLS, SASL);
- :mod:`gateway.backend.kafka.cluster`: brokers, partition leaders, connections;
- :mod:`gateway.backend.kafka.health`: whether the upstream answers, logged per change;
- :mod:`gateway.backend.kafka.produce`: the idempotent producer, a batch per partition;
- :mod:`gateway.backend.kafka.fetcher`: one Fetch, its batches made bundles;
- :mod:`gateway.backend.kafka.feeds`: one tail read per partition shared by its readers;
- :mod:`gateway.backend.kafka.history`: reads away from the tail;
- :mod:`gateway.backend.kafka.backend`: the backend itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

import structlog
import trio

from gateway.backend.kafka.backend import KafkaBackend
from gateway.backend.kafka.cluster import Cluster
from gateway.backend.kafka.feeds import TailFeeds
from gateway.backend.kafka.health import UpstreamHealth
from gateway.backend.kafka.history import HistoryReader
from gateway.backend.kafka.produce import UpstreamProducer
from gateway.backend.kafka.settings import UpstreamKafkaSettings
from gateway.backend.kafka.wire import Security
from gateway.client.lone import raise_lone
from gateway.client.tls import client_context
from gateway.core.contract import UpstreamUnavailable
from gateway.core.metrics import GaugeCollector, Metrics
from protocols.kafka.codecs import Compression
from protocols.kafka.records import MetadataRequest
from protocols.kafka.types import ApiKey

__all__ = ["KafkaBackend", "UpstreamKafkaSettings", "UpstreamUnavailable", "bootstrap_addresses",
           "open_kafka_backend", "security_of"]

log = structlog.get_logger("figtank.upstream_kafka")

#: Seconds the producer gets to deliver what it holds when the backend closes outside a
#: graceful stop (a graceful stop gives it what is left of the grace period).
FLUSH_SECS: Final = 5.0
#: How long one request to the upstream may take (connecting included).
REQUEST_TIMEOUT_SECS: Final = 5.0


def security_of(settings: UpstreamKafkaSettings) -> Security:
    """TLS and SASL to the upstream, as the settings say."""
    tls = bool(settings.tls or settings.tls_ca or settings.tls_cert)
    context = None
    if tls:
        context = client_context(ca=settings.tls_ca or None,
                                 cert=settings.tls_cert or None,
                                 key=settings.tls_key or None)
    return Security(context, settings.sasl_mechanism, settings.sasl_username,
                    settings.sasl_password)


def bootstrap_addresses(settings: UpstreamKafkaSettings) -> list[tuple[str, int]]:
    """The bootstrap servers as ``(host, port)``."""
    out = []
    for address in settings.bootstrap_servers:
        host, _, port = address.rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out


@asynccontextmanager
async def open_kafka_backend(settings: UpstreamKafkaSettings, metrics: Metrics | None = None, *,
                             wait_secs: float | None = None, probe_interval: float = 5.0,
                             feed_idle_secs: float = 30.0,
                             flush_deadline: Callable[[], float | None] | None = None
                             ) -> AsyncIterator[KafkaBackend]:
    """Serve ``settings.bootstrap_servers`` as a backend for the block.

    Returns after the first probe of the upstream whether or not it answered (the gateway
    starts, not ready, and serves once the upstream answers). On exit the producer
    delivers what it still holds until ``flush_deadline()`` (the end of the server's
    grace period, trio time), or for :data:`FLUSH_SECS` when that gives None; with nothing
    in flight it closes at once. Messages it then still holds were never acknowledged to
    a client (a front end answers only after the upstream did).
    """
    security = security_of(settings)
    try:
        async with trio.open_nursery() as connections:
            cluster = Cluster(bootstrap_addresses(settings), connections, security=security,
                              client_id=settings.client_id,
                              timeout=REQUEST_TIMEOUT_SECS)
            try:
                async with trio.open_nursery() as nursery:
                    backend = _make_backend(cluster, settings, metrics, wait_secs,
                                            probe_interval, feed_idle_secs)
                    backend._spawn = backend.history.spawn = nursery.start_soon
                    await nursery.start(backend.producer.run)
                    await nursery.start(backend.feeds.run)
                    await nursery.start(backend.health.run)
                    try:
                        yield backend
                    finally:
                        with trio.CancelScope(shield=True):
                            left = await backend.producer.flush(
                                trio.current_time() + _flush_secs(flush_deadline))
                        if left:
                            log.warning("upstream_unacknowledged_at_stop", messages=left)
                        nursery.cancel_scope.cancel()
            finally:
                cluster.close()
                connections.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise_lone(group)


def _make_backend(cluster: Cluster, settings: UpstreamKafkaSettings, metrics: Metrics | None,
                  wait_secs: float | None, probe_interval: float,
                  feed_idle_secs: float) -> KafkaBackend:
    health_box: list[UpstreamHealth] = []

    def trouble() -> None:
        if health_box:
            health_box[0].suspect()

    async def probe(timeout: float) -> None:
        connection = await cluster.any_broker()
        answer = await connection.call(ApiKey.METADATA, MetadataRequest(topics=[],
                                                          allow_auto_topic_creation=False),
                                       timeout=timeout)
        cluster.learn(answer)

    health = UpstreamHealth(probe, settings.bootstrap_servers, metrics=metrics,
                            interval=probe_interval)
    health_box.append(health)
    feeds = TailFeeds(cluster, cache_bytes=max(settings.tail_cache_bytes // 16, 256 * 1024),
                      idle_secs=feed_idle_secs, timeout=REQUEST_TIMEOUT_SECS,
                      metrics=metrics, on_trouble=trouble)
    producer = UpstreamProducer(
        cluster, metrics=metrics, on_stored=feeds.stored,
        delivery_timeout=settings.delivery_timeout_secs,
        request_timeout=REQUEST_TIMEOUT_SECS,
        max_batch_bytes=settings.max_batch_bytes,
        compression=(None if settings.compression == "producer"
                     else Compression[settings.compression.upper()]),
        on_trouble=trouble)
    history = HistoryReader(cluster, timeout=REQUEST_TIMEOUT_SECS,
                            read_ahead=settings.read_ahead, metrics=metrics)
    if metrics is not None:
        _add_gauges(metrics, cluster, producer, feeds, history)
    return KafkaBackend(cluster=cluster, producer=producer, feeds=feeds, history=history,
                        health=health, auto_create_topics=settings.auto_create_topics,
                        default_partitions=settings.default_partitions,
                        max_bundle_bytes=settings.max_bundle_bytes,
                        wait_secs=(settings.wait_secs if wait_secs is None
                                   else wait_secs),
                        metrics=metrics)


def _add_gauges(metrics: Metrics, cluster: Cluster, producer: UpstreamProducer,
                feeds: TailFeeds, history: HistoryReader) -> None:
    """What the gateway holds for the upstream, read at scrape time."""
    metrics.add_collector(GaugeCollector(
        "figtank_upstream_connections", "Upstream-Kafka mode: open connections to the "
        "cluster's brokers, by lane (main, produce, feed: one per partition being read).",
        ["lane"], lambda: [([lane], count) for lane, count in cluster.open_lanes().items()]))
    metrics.add_collector(GaugeCollector(
        "figtank_upstream_feeds", "Upstream-Kafka mode: partitions read at their tail (one "
        "upstream read each, shared by their readers), and the bytes their caches hold.",
        ["what"], lambda: [(["feeds"], float(len(feeds.feeds))),
                           (["cached_bytes"], float(sum(
                               f.cached_bytes for f in list(feeds.feeds.values()))))]))
    metrics.add_collector(GaugeCollector(
        "figtank_upstream_read_ahead", "Upstream-Kafka mode: reads behind the tail fetched "
        "ahead of their reader (at most upstream_kafka.read_ahead), and the bytes of those "
        "that arrived.", ["what"], lambda: [(["reads"], float(history.held())),
                                            (["bytes"], float(history.held_bytes()))]))
    metrics.add_collector(GaugeCollector(
        "figtank_upstream_unacknowledged_messages", "Upstream-Kafka mode: messages handed to "
        "the gateway's producer and not yet acknowledged by the cluster.", [],
        lambda: [([], float(producer.in_flight()))]))


def _flush_secs(deadline: Callable[[], float | None] | None) -> float:
    """How long the producer may flush: until the deadline, else :data:`FLUSH_SECS`."""
    at = deadline() if deadline is not None else None
    if at is None:
        return FLUSH_SECS
    return max(0.0, at - trio.current_time())
