"""Prometheus metrics of one gateway (served over HTTP by :mod:`gateway.server.endpoint`).

Each server owns a :class:`Metrics` with its own registry, so several servers in
one process (tests, a bridge in front of an embedded upstream) keep separate
counts. Hot paths count per batch (``inc(n)``), never per message.

The endpoint renders the registry in a worker thread while the event loop goes on changing
what it reports: everything a collector reads must be safe to read from another thread
(prometheus_client's own metrics lock; the callbacks here take ``list(...)`` snapshots of
the loop's dicts, which CPython copies without running Python code in between).

The busiest counts (:meth:`Metrics.appended`, :meth:`Metrics.sent`, :class:`RequestCounter`
and any :meth:`Metrics.loop_count`) are plain totals that the event loop adds to, one
writer, moved into their counters when the metrics are rendered (:meth:`Metrics.flush`): a
Produce or a delivery costs no counter lock.

Per-topic series are bounded (``limits.metric_topics``): the first topics seen get their
own series, the others are summed under ``topic="_other"`` (see :class:`TopicLabels`).
"""

from __future__ import annotations

import math
import operator
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

log = structlog.get_logger("figtank.metrics")

#: The topic label of the topics over ``limits.metric_topics`` (their partition label too).
OTHER: Final = "_other"
#: ``limits.metric_topics``' default.
DEFAULT_METRIC_TOPICS: Final = 1000

Samples = list[tuple[list[str], float]]

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5)


class ReaderLag:
    """How far each reader of a partition is behind its high-water mark.

    Readers (Figg subscriptions, Tank consumers per connection and partition) report
    the next sequence they will read and the high-water mark they last saw; a scrape
    reports, per partition, the largest lag in messages and the number of readers.
    """

    def __init__(self) -> None:
        self._readers: dict[object, tuple[str, str, int, int]] = {}

    def update(self, reader: object, protocol: str, topic: str, partition: int,
               next_seq: int, high_water_mark: int) -> None:
        """Record ``reader``'s position (cheap: called once per fetch, not per message)."""
        self._readers[reader] = (protocol, topic, partition,
                                 max(high_water_mark - (next_seq - 1), 0))

    def remove(self, reader: object) -> None:
        self._readers.pop(reader, None)

    def samples(self) -> tuple[Samples, Samples]:
        """(largest lag, reader count) per ``[protocol, topic, partition]`` (safe to call
        from another thread than the loop's that updates the readers)."""
        worst: dict[tuple[str, str, int], int] = {}
        count: dict[tuple[str, str, int], int] = {}
        for protocol, topic, partition, lag in list(self._readers.values()):
            key = (protocol, topic, partition)
            worst[key] = max(worst.get(key, 0), lag)
            count[key] = count.get(key, 0) + 1
        return ([([p, t, str(n)], float(v)) for (p, t, n), v in worst.items()],
                [([p, t, str(n)], float(v)) for (p, t, n), v in count.items()])


class TopicLabels:
    """Which topics have series of their own: the first ``limit`` asked about, for good
    (a counter's series can not be taken back); the others are labelled :data:`OTHER`.

    Safe to call from any thread. ``on_fold`` is called once for each topic folded.
    """

    def __init__(self, limit: int, on_fold: Callable[[str], None]) -> None:
        self.limit = limit
        self._own: set[str] = set()
        self._folded: set[str] = set()
        self._on_fold = on_fold
        self._lock = threading.Lock()

    def __call__(self, topic: str) -> str:
        """``topic``'s label: itself, or :data:`OTHER` once the limit is reached."""
        if topic in self._own:
            return topic
        with self._lock:
            if topic in self._own or len(self._own) < self.limit:
                self._own.add(topic)
                return topic
            if topic not in self._folded:
                self._folded.add(topic)
                self._on_fold(topic)
        return OTHER


#: A metric family (its ``labels`` gives a child of its own type).
M = TypeVar("M", bound=MetricWrapperBase)
#: prometheus_client leaves this one untyped.
_go_float: Callable[[float], str] = floatToGoString


class LoopCount:
    """A counter child counted by the event loop without its lock: a plain total, moved
    into the child by :meth:`Metrics.flush` (one writer, the loop)."""

    __slots__ = ("_child", "_counted", "value")

    def __init__(self, child: Counter) -> None:
        self.value = 0
        self._counted = 0
        self._child = child

    def inc(self, amount: int = 1) -> None:
        """Count ``amount`` (in the event loop)."""
        self.value += amount

    def flush(self) -> None:
        """Move what was counted since the last flush into the child."""
        value = self.value
        if value != self._counted:
            self._child.inc(value - self._counted)
            self._counted = value


class TopicTotals:
    """A topic's messages and bytes, in or out: two :class:`LoopCount`\\ s."""

    __slots__ = ("messages", "size")

    def __init__(self, messages: LoopCount, size: LoopCount) -> None:
        self.messages = messages
        self.size = size

    def add(self, messages: int, size: int) -> None:
        """Count ``messages`` messages in ``size`` bytes (in the event loop)."""
        self.messages.value += messages
        self.size.value += size


class Metrics:
    """The counters, gauges and histograms the gateway reports. ``metric_topics``
    (``limits.metric_topics``): topics with series of their own in per-topic metrics."""

    def __init__(self, metric_topics: int = DEFAULT_METRIC_TOPICS) -> None:
        self._fold_logged = False
        self.topic_label = TopicLabels(metric_topics, self._folded)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # ``listener``: the listener's name (``figg``, ``tank``, or a [listeners.NAME]).
        self.connections = Gauge("figtank_connections", "Open client connections.",
                                 ["protocol", "listener"], registry=r)
        self.connections_accepted = Counter(
            "figtank_connections_accepted", "Connections accepted.", ["protocol", "listener"],
            registry=r)
        self.connections_closed = Counter(
            "figtank_connections_closed", "Connections closed, by reason.",
            ["protocol", "listener", "reason"], registry=r)
        self.tls_handshake_failures = Counter(
            "figtank_tls_handshake_failures",
            "TLS handshakes that failed, by listener and kind (refused: the TLS layer "
            "refused it, e.g. no client certificate; timeout; eof).",
            ["listener", "kind"], registry=r)
        self.requests = Counter("figtank_requests", "Requests handled, by type and result.",
                                ["protocol", "type", "result"], registry=r)
        self.messages_in = Counter("figtank_messages_in", "Messages appended.", ["topic"],
                                   registry=r)
        self.bytes_in = Counter("figtank_bytes_in", "Bundle bytes appended.", ["topic"],
                                registry=r)
        self.messages_out = Counter("figtank_messages_out",
                                    "Messages delivered to Figg subscribers.", ["topic"],
                                    registry=r)
        self.bytes_out = Counter("figtank_bytes_out", "Chunk and DATA bytes sent.", ["topic"],
                                 registry=r)
        self.append_seconds = LoopHistogram(
            "figtank_append_seconds", "Time from append request to acknowledgement.",
            _LATENCY_BUCKETS)
        r.register(self.append_seconds)
        # Exported only by the backend they describe (see include()).
        self.fsync_seconds = Histogram("figtank_fsync_seconds", "Duration of one group fsync.",
                                       buckets=_LATENCY_BUCKETS, registry=None)
        self.upstream_up = Gauge(
            "figtank_upstream_up", "Bridge and upstream-Kafka modes: 1 while the upstream "
            "answers.", registry=None)
        self.upstream_outages = Counter(
            "figtank_upstream_outages", "Bridge and upstream-Kafka modes: times the upstream "
            "became unreachable.", registry=None)
        self.upstream_errors = Counter(
            "figtank_upstream_errors", "Upstream-Kafka mode: errors the upstream cluster "
            "answered, by operation (produce, fetch, metadata, create_topic) and error "
            "(Kafka's name, e.g. MESSAGE_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED; TIMED_OUT, "
            "NETWORK_EXCEPTION).", ["operation", "error"],
            registry=None)
        self.upstream_feed_written_through = Counter(
            "figtank_upstream_feed_written_through_messages", "Upstream-Kafka mode: "
            "messages the gateway produced that went to its subscribers' feed from the "
            "Produce answer, without a Fetch.", registry=None)
        self.upstream_feed_pushes = Counter(
            "figtank_upstream_feed_pushes", "Upstream-Kafka mode: arrivals a feed handed "
            "to the readers at its tail from the task that brought them (no reader woke "
            "up to fetch them).", registry=None)
        self.upstream_read_aheads = Counter(
            "figtank_upstream_read_aheads", "Upstream-Kafka mode: reads behind the tail "
            "fetched ahead of their reader, by outcome: taken (by the read they were for), "
            "dropped (not taken within 5 s, or holding more than their read asked for), "
            "failed (their read asked again itself: the Fetch failed or found nothing, or "
            "what it found was over the bytes bound).", ["outcome"], registry=None)
        self.data_loss_events = Counter(
            "figtank_data_loss_events", "Damaged regions found in rolled segments, and "
            "corrupt or torn tails recovery cut off active segments.", registry=None)
        self.data_loss_messages = Counter(
            "figtank_data_loss_messages", "Sequence numbers the damaged or cut data held "
            "(at most this many messages: sparse bundles leave gaps).", registry=None)
        self.data_loss_bytes = Counter(
            "figtank_data_loss_bytes", "Bytes of segment files found damaged or cut.",
            registry=None)
        self.store_write_failures = Counter(
            "figtank_store_write_failures", "Writes of the embedded store that failed or "
            "were refused, by kind: below_floor (refused: it would have left less free "
            "than store.min_free_bytes), no_space (the filesystem was full), read_only "
            "(mounted read-only), io_error (an I/O error), fsync (a group fsync failed).",
            ["kind"], registry=None)
        self.limit_hits = Counter(
            "figtank_limit_hits", "Times a resource limit refused or delayed a client, by "
            "limit (the setting's name).", ["limit"], registry=r)
        self.access_denied = Counter(
            "figtank_access_denied", "Requests (per topic) the access policy refused, by "
            "listener and operation.", ["listener", "operation"], registry=r)
        self.sasl_failures = Counter(
            "figtank_sasl_auth_failures", "Failed SASL authentications (wrong credentials, "
            "malformed or out-of-order exchanges, unsupported mechanisms), by listener and "
            "mechanism.", ["listener", "mechanism"], registry=r)
        self.quota_delay = Counter(
            "figtank_quota_delay_seconds", "Seconds connections were held back by their "
            "principal's quota, by direction (in: reads from the client waited; out: data "
            "for the client waited).", ["direction"], registry=r)
        self.kafka_groups = Gauge(
            "figtank_kafka_groups", "Kafka consumer groups with members (or joining), by "
            "state.", ["state"], registry=r)
        self.kafka_group_members = Gauge(
            "figtank_kafka_group_members", "Members of all Kafka consumer groups "
            "together.", registry=r)
        self.kafka_group_rebalances = Counter(
            "figtank_kafka_group_rebalances", "Rebalances of Kafka consumer groups begun, "
            "by reason (join, leave, session_timeout, sync_timeout, assignment_refused).",
            ["reason"], registry=r)
        self.kafka_producer_retries = Counter(
            "figtank_kafka_producer_retries", "Idempotent producers' batches answered as "
            "the batch they retry (not stored again), by where the original was known: "
            "memory, or stored (the partition's durable producer state: after a restart).",
            ["known_from"], registry=r)
        self._included: set[int] = set()

        self.reader_lag = ReaderLag()
        labels = ["protocol", "topic", "partition"]
        r.register(GaugeCollector(
            "figtank_reader_lag_messages",
            "Largest lag behind the high-water mark among a partition's readers "
            "(Figg subscribers, Tank consumers), as of their last read.",
            labels, lambda: self.fold_topics(self.reader_lag.samples()[0], max, topic_at=1)))
        r.register(GaugeCollector(
            "figtank_readers", "Readers of a partition.", labels,
            lambda: self.fold_topics(self.reader_lag.samples()[1], operator.add, topic_at=1)))

        #: Counter children counted by the loop (:meth:`loop_count`), by the child's id.
        self._loop_counts: dict[int, LoopCount] = {}
        #: By topic: the totals appended and sent (:meth:`appended`, :meth:`sent`).
        self._appended: dict[str, TopicTotals] = {}
        self._sent: dict[str, TopicTotals] = {}
        self._flushes: list[Callable[[], None]] = [self._flush_loop_counts]
        self._flush_lock = threading.Lock()

    def appended(self, topic: str, messages: int, size: int) -> None:
        """Count an append of ``messages`` messages in ``size`` bytes to ``topic`` (in the
        event loop: added to the counters by :meth:`flush`)."""
        totals = self._appended.get(topic)
        if totals is None:
            totals = self._appended[topic] = self._topic_totals(
                topic, self.messages_in, self.bytes_in)
        totals.add(messages, size)

    def sent(self, topic: str) -> TopicTotals:
        """The messages and bytes sent to readers of ``topic`` (``messages_out``,
        ``bytes_out``), to count in the event loop."""
        totals = self._sent.get(topic)
        if totals is None:
            totals = self._sent[topic] = self._topic_totals(
                topic, self.messages_out, self.bytes_out)
        return totals

    def _topic_totals(self, topic: str, messages: Counter, size: Counter) -> TopicTotals:
        label = self.topic_label(topic)
        return TopicTotals(self.loop_count(messages.labels(label)),
                           self.loop_count(size.labels(label)))

    def loop_count(self, child: Counter) -> LoopCount:
        """``child`` (a counter, or a child of a labelled one) counted by the event loop
        without a lock (:class:`LoopCount`): for counts made on every request or
        delivery."""
        count = self._loop_counts.get(id(child))
        if count is None:
            count = self._loop_counts[id(child)] = LoopCount(child)
        return count

    def _flush_loop_counts(self) -> None:
        for count in list(self._loop_counts.values()):
            count.flush()

    def on_flush(self, flush: Callable[[], None]) -> None:
        """Have :meth:`flush` call ``flush`` (which moves totals into counters)."""
        self._flushes.append(flush)

    def flush(self) -> None:
        """Move the totals counted without a lock into their counters (any thread; done
        by :meth:`render`, and by whoever reads those counters themselves)."""
        with self._flush_lock:
            for flush in self._flushes:
                flush()

    def for_topic(self, family: M, topic: str) -> M:
        """The child of the per-topic ``family`` (``messages_out``, ``bytes_out``...) that
        counts for ``topic``: its own, or the :data:`OTHER` one."""
        return family.labels(self.topic_label(topic))

    def fold_topics(self, samples: Iterable[tuple[list[str], float]],
                    combine: Callable[[float, float], float], *, topic_at: int = 0
                    ) -> Samples:
        """Per-topic samples of a collector with the topics over the limit combined
        (``combine``: how two values make one, e.g. ``max``) under :data:`OTHER`; the
        label after the topic (the partition) becomes :data:`OTHER` there as well."""
        folded: dict[tuple[str, ...], float] = {}
        for labels, value in samples:
            if self.topic_label(labels[topic_at]) == OTHER:
                labels = [*labels[:topic_at], OTHER, OTHER, *labels[topic_at + 2:]]
            key = tuple(labels)
            folded[key] = combine(folded[key], value) if key in folded else value
        return [(list(key), value) for key, value in folded.items()]

    def _folded(self, topic: str) -> None:
        """A topic over ``limits.metric_topics``: counted each time, logged the first."""
        if not self._fold_logged:
            self._fold_logged = True
            log.warning("metric_topics_limit_reached", limit=self.topic_label.limit,
                        topic=topic, action=f"counted under topic={OTHER!r}, as are the "
                        "further topics over the limit (figtank_limit_hits counts them)")
        self.limit_hit("metric_topics")
    def data_lost(self, messages: int, size: int) -> None:
        """Count one damaged region (or recovery cut) of ``size`` bytes that held
        ``messages`` sequence numbers (the store calls this, also from its threads)."""
        self.data_loss_events.inc()
        self.data_loss_messages.inc(messages)
        self.data_loss_bytes.inc(size)

    def limit_hit(self, limit: str, count: int = 1) -> None:
        """Count ``count`` hits of the limit named by its setting (``max_topics``...)."""
        self.limit_hits.labels(limit).inc(count)

    def include(self, *metrics: Collector) -> None:
        """Export metrics created without a registry (those of one backend: the store's
        ``fsync_seconds``, the bridge's ``upstream_*``); a second call is harmless."""
        for metric in metrics:
            if id(metric) not in self._included:
                self._included.add(id(metric))
                self.registry.register(metric)

    def add_collector(self, collector: Collector) -> None:
        """Register a collector computed at scrape time (store sizes, lag)."""
        self.registry.register(collector)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        self.flush()
        return generate_latest(self.registry)


class RequestCounter:
    """``figtank_requests{protocol=...}`` children of one protocol, looked up once per
    (type, result) rather than per request, and counted by the event loop
    (:meth:`Metrics.loop_count`)."""

    def __init__(self, metrics: Metrics, protocol: str) -> None:
        self._metrics = metrics
        self._protocol = protocol
        self._counts: dict[tuple[str, bool], LoopCount] = {}

    def inc(self, kind: str, ok: bool = True, count: int = 1) -> None:
        """Count ``count`` requests (in the event loop: added to the counter by the next
        flush)."""
        key = (kind, ok)
        counted = self._counts.get(key)
        if counted is None:
            metrics = self._metrics
            counted = self._counts[key] = metrics.loop_count(metrics.requests.labels(
                self._protocol, kind, "ok" if ok else "error"))
        counted.value += count


class GaugeCollector(Collector):
    """A gauge family whose samples a callback computes at scrape time (in the endpoint's
    worker thread: the callback must only read, snapshotting what the loop mutates)."""

    def __init__(self, name: str, documentation: str, labels: list[str],
                 samples: Callable[[], Iterable[tuple[list[str], float]]]) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = labels
        self._samples = samples

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._labels)
        for label_values, value in self._samples():
            family.add_metric(label_values, value)
        yield family

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._documentation, labels=self._labels)


class LoopHistogram(Collector):
    """A histogram (no labels) observed by the event loop alone: plain counts, one writer,
    made into the family when the registry is collected (a consistent snapshot of the
    bucket counts; the sum at most an observation apart). :meth:`observe` is one call,
    where prometheus_client's takes a lock per bucket and sum."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = [*buckets, math.inf]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        """Count one observation of ``amount``."""
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def collect(self) -> Iterable[HistogramMetricFamily]:
        counts = list(self._counts)
        total = self._sum
        buckets = []
        cumulative = 0
        for bound, count in zip(self._bounds, counts, strict=True):
            cumulative += count
            buckets.append((_go_float(bound), cumulative))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets,
                                    sum_value=total)

    def describe(self) -> Iterable[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation)
