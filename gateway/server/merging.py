"""The metrics of several worker processes made into one exposition (``figtank serve
--workers N``).

Each worker renders its own registry on a private endpoint; :class:`MetricsMerger` adds
up the samples of the same name and labels: counters, histograms and most gauges (open
connections, readers, caches) are sums. A few gauges describe the one log all workers
front, seen alike by each: those are the largest (lags, topic counts) or, for
``figtank_upstream_up``, the smallest of the workers' values. ``_created`` samples are the
earliest.

The renderings are all prometheus_client's, so a sample's name and labels are written
the same way by every worker: the text before a sample's value is its key, and the merge
reads no label (a parser of the format costs some 60 ms a worker for 1,700 lines).

A worker that exits takes its counts with it. So that a counter of the whole never goes
down (a scraper would take the drop for a reset), the counts a worker had at its last
scrape are kept (:meth:`MetricsMerger.retire`) and added to what the others count; what
it counted after that scrape is lost.

Per worker, the merge adds ``figtank_worker_connections{worker,pid,listener}`` (its open
connections) and ``figtank_worker_connections_accepted_total{worker,pid,listener}``,
which show how the kernel spread connections over the workers.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

#: Gauges every worker reports the same of (the upstream's log): the largest value.
LARGEST: Final = frozenset({
    "figtank_reader_lag_messages", "figtank_committed_lag_messages", "figtank_topics",
    "figtank_partitions", "figtank_partition_bytes", "figtank_committed_offsets"})
#: Gauges true of the whole only when true of every worker: the smallest value.
SMALLEST: Final = frozenset({"figtank_upstream_up"})
#: The families whose samples only ever grow (kept when their worker exits).
_COUNTING: Final = frozenset({"counter", "histogram", "summary"})
_LISTENER = re.compile(r'listener="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Source:
    """A process whose metrics are merged: the worker's index (or a name) and its pid."""

    worker: str
    pid: int


@dataclass(slots=True)
class Family:
    """One family of an exposition: its ``# HELP`` and ``# TYPE`` and its samples, by
    the text before their value (name and labels)."""

    name: str
    help: str = ""
    type: str = "untyped"
    samples: dict[str, float] = field(default_factory=dict)

    def combine(self) -> Callable[[float, float], float]:
        """How two workers' values of one sample make the whole's."""
        if self.name.endswith("_created"):
            return min
        if self.type == "gauge" and self.name in LARGEST:
            return max
        if self.type == "gauge" and self.name in SMALLEST:
            return min
        return _add


def _add(a: float, b: float) -> float:
    return a + b


def parse(text: str) -> dict[str, Family]:
    """The families of one prometheus_client rendering, by name (in their order)."""
    families: dict[str, Family] = {}
    family = Family("")
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                family = families.get(parts[2]) or families.setdefault(parts[2],
                                                                        Family(parts[2]))
                if parts[1] == "HELP":
                    family.help = parts[3] if len(parts) > 3 else ""
                else:
                    family.type = parts[3] if len(parts) > 3 else "untyped"
            continue
        key, _, value = line.rpartition(" ")
        if key:
            family.samples[key] = float(value)
    return families


class MetricsMerger:
    """Merges the renderings of the workers (and the supervisor's own) into one, keeping
    the counts of workers gone (:meth:`retire`). Safe to use from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The families each source had at its last merge.
        self._last: dict[Source, dict[str, Family]] = {}
        #: The counts of the sources gone, summed.
        self._retired: dict[str, Family] = {}
        #: The sources gone (a rendering fetched before one went is not merged after).
        self._gone: set[Source] = set()

    def retire(self, source: Source) -> None:
        """``source`` exited: keep what its counters had counted at its last scrape."""
        with self._lock:
            self._gone.add(source)
            families = self._last.pop(source, {})
            _merge_into(self._retired, (f for f in families.values() if f.type in _COUNTING))

    def merge(self, texts: Mapping[Source, str], own: str = "") -> dict[str, Family]:
        """The families of the renderings ``texts`` of the workers serving, ``own`` (the
        supervisor's: merged, with no series of a worker) and the counts retired; a text
        that does not parse is left out."""
        parsed: dict[Source, dict[str, Family]] = {}
        for source, text in texts.items():
            try:
                parsed[source] = parse(text)
            except ValueError:
                continue
        merged: dict[str, Family] = {}
        with self._lock:
            for source in self._gone.intersection(parsed):
                del parsed[source]  # its counts are among the retired already
            self._last.update(parsed)
            for families in (*parsed.values(), parse(own), self._retired):
                _merge_into(merged, families.values())
        for family in _per_worker(parsed):
            merged[family.name] = family
        return merged

    def render(self, texts: Mapping[Source, str], own: str = "") -> bytes:
        """:meth:`merge` as a Prometheus text exposition."""
        return render(self.merge(texts, own).values())


def _merge_into(merged: dict[str, Family], families: Iterable[Family]) -> None:
    for family in families:
        into = merged.get(family.name)
        if into is None:
            merged[family.name] = Family(family.name, family.help, family.type,
                                         dict(family.samples))
            continue
        combine = into.combine()
        samples = into.samples
        for key, value in family.samples.items():
            samples[key] = combine(samples[key], value) if key in samples else value


def render(families: Iterable[Family]) -> bytes:
    """The text exposition of ``families``."""
    out: list[str] = []
    for family in families:
        out.append(f"# HELP {family.name} {family.help}\n# TYPE {family.name} {family.type}\n")
        out.extend(f"{key} {_number(value)}\n" for key, value in family.samples.items())
    return "".join(out).encode()


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "NaN" if math.isnan(value) else repr(value)


def _per_worker(parsed: Mapping[Source, Mapping[str, Family]]) -> list[Family]:
    """``figtank_worker_connections{worker,pid,listener}`` and
    ``figtank_worker_connections_accepted_total{worker,pid,listener}`` of each source."""
    made = []
    for name, help, kind, family, sample in (
            ("figtank_worker_connections", "Open client connections of each worker "
             "process, by listener.", "gauge", "figtank_connections", "figtank_connections"),
            ("figtank_worker_connections_accepted_total", "Connections each worker process "
             "accepted, by listener.", "counter", "figtank_connections_accepted_total",
             "figtank_connections_accepted_total")):
        merged = Family(name, help, kind)
        for source, families in parsed.items():
            found = families.get(family)
            by_listener: dict[str, float] = {}
            for key, value in (found.samples.items() if found else ()):
                if key.startswith(sample + "{") or key == sample:
                    match = _LISTENER.search(key)
                    listener = match.group(1) if match else ""
                    by_listener[listener] = by_listener.get(listener, 0.0) + value
            for listener, value in by_listener.items():
                merged.samples[f'{name}{{listener="{listener}",pid="{source.pid}",'
                               f'worker="{source.worker}"}}'] = value
        made.append(merged)
    return made
