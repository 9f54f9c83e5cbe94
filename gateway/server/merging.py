"""The metrics of several worker processes made into one exposition (``figtank serve
--workers N``).

Each worker renders its own registry on a private endpoint; :class:`MetricsMerger` parses
the renderings and adds up samples of the same name and labels: counters, histograms and
most gauges (open connections, readers, caches) are sums. A few gauges describe the one
log all workers front, seen alike by each: those are the largest (lags, topic counts)
or, for ``figtank_upstream_up``, the smallest of the workers' values. ``_created``
samples are the earliest.

A worker that exits takes its counts with it. So that a counter of the whole never goes
down (a scraper would take the drop for a reset), the counts a worker had at its last
scrape are kept (:meth:`MetricsMerger.retire`) and added to what the others count; what
it counted after that scrape is lost.

Per worker, the merge adds ``figtank_worker_connections{worker,pid,listener}`` (its open
connections) and ``figtank_worker_connections_accepted_total{worker,pid,listener}``,
which show how the kernel spread connections over the workers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

#: Gauges every worker reports the same of (the upstream's log): the largest value.
LARGEST: Final = frozenset({
    "figtank_reader_lag_messages", "figtank_committed_lag_messages", "figtank_topics",
    "figtank_partitions", "figtank_partition_bytes", "figtank_committed_offsets"})
#: Gauges true of the whole only when true of every worker: the smallest value.
SMALLEST: Final = frozenset({"figtank_upstream_up"})

#: A sample: its name and its labels, sorted.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Source:
    """A process whose metrics are merged: the worker's index (or a name) and its pid."""

    worker: str
    pid: int


@dataclass(slots=True)
class _Family:
    name: str
    documentation: str
    type: str
    samples: dict[SampleKey, float]


def _combine(family: str, kind: str, sample: str) -> Callable[[float, float], float]:
    if sample.endswith("_created"):
        return min
    if kind == "gauge" and family in LARGEST:
        return max
    if kind == "gauge" and family in SMALLEST:
        return min
    return _add


def _add(a: float, b: float) -> float:
    return a + b


def _counts(family: _Family) -> bool:
    """Whether the family's samples only ever grow (kept when their worker exits)."""
    return family.type in ("counter", "histogram", "summary")


def parse(text: str) -> dict[str, _Family]:
    """The families of one Prometheus text exposition, by name."""
    families: dict[str, _Family] = {}
    for metric in text_string_to_metric_families(text):
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in metric.samples}
        families[metric.name] = _Family(metric.name, metric.documentation, metric.type,
                                        samples)
    return families


class MetricsMerger:
    """Merges the renderings of the workers (and the supervisor's own) into one, keeping
    the counts of workers gone (:meth:`retire`). Safe to use from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The families each source had at its last merge.
        self._last: dict[Source, dict[str, _Family]] = {}
        #: The counts of the sources gone, summed.
        self._retired: dict[str, _Family] = {}

    def retire(self, source: Source) -> None:
        """``source`` exited: keep what its counters had counted at its last scrape."""
        with self._lock:
            families = self._last.pop(source, {})
            for name, family in families.items():
                if _counts(family):
                    _merge_into(self._retired, name, family)

    def merge(self, texts: Mapping[Source, str], own: str = "") -> list[Metric]:
        """One family list of the renderings ``texts`` of the workers serving, ``own``
        (the supervisor's: merged, with no series of a worker) and the counts retired; a
        text that does not parse is left out."""
        parsed: dict[Source, dict[str, _Family]] = {}
        for source, text in texts.items():
            try:
                parsed[source] = parse(text)
            except ValueError:
                continue
        mine = parse(own)
        with self._lock:
            self._last.update(parsed)
            merged: dict[str, _Family] = {}
            for families in (*parsed.values(), mine, self._retired):
                for name, family in families.items():
                    _merge_into(merged, name, family)
        metrics = [_metric(family) for family in merged.values()]
        metrics += _per_worker(parsed)
        return metrics

    def render(self, texts: Mapping[Source, str], own: str = "") -> bytes:
        """:meth:`merge` as a Prometheus text exposition."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Fixed(self.merge(texts, own)))
        return generate_latest(registry)


def _merge_into(merged: dict[str, _Family], name: str, family: _Family) -> None:
    into = merged.get(name)
    if into is None:
        merged[name] = _Family(family.name, family.documentation, family.type,
                               dict(family.samples))
        return
    for key, value in family.samples.items():
        if key in into.samples:
            into.samples[key] = _combine(name, family.type, key[0])(into.samples[key], value)
        else:
            into.samples[key] = value


def _metric(family: _Family) -> Metric:
    metric = Metric(family.name, family.documentation, family.type)
    for (name, labels), value in family.samples.items():
        metric.add_sample(name, dict(labels), value)
    return metric


def _per_worker(parsed: Mapping[Source, Mapping[str, _Family]]) -> list[Metric]:
    """``figtank_worker_connections{worker,pid,listener}`` and
    ``figtank_worker_connections_accepted_total{worker,pid,listener}`` of each source."""
    open_now = Metric("figtank_worker_connections",
                      "Open client connections of each worker process, by listener.", "gauge")
    accepted = Metric("figtank_worker_connections_accepted",
                      "Connections each worker process accepted, by listener.", "counter")
    for source, families in parsed.items():
        for metric, family, sample in (
                (open_now, "figtank_connections", "figtank_connections"),
                (accepted, "figtank_connections_accepted",
                 "figtank_connections_accepted_total")):
            by_listener: dict[str, float] = {}
            found = families.get(family)
            for (name, labels), value in (found.samples.items() if found else ()):
                if name == sample:
                    listener = dict(labels).get("listener", "")
                    by_listener[listener] = by_listener.get(listener, 0.0) + value
            for listener, value in by_listener.items():
                metric.add_sample(sample.replace("figtank_", "figtank_worker_", 1),
                                  {"worker": source.worker, "pid": str(source.pid),
                                   "listener": listener}, value)
    return [open_now, accepted]


class _Fixed(Collector):
    """A collector of families made already."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return iter(self._metrics)
