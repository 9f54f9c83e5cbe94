"""How far each group's committed offsets are behind the log: Prometheus gauges.

``figtank_committed_lag_messages{group,topic,partition}`` is the partition's high-water
mark minus the committed offset (never below 0): the messages the group has not
committed yet, the same measure as ``figtank_reader_lag_messages`` (a committed Kafka
offset ``c`` means the next sequence read is ``c + 1``). The high-water marks are
refreshed every :data:`REFRESH_SECS`; at most ``offsets.lag_series`` series are reported
(the first by group, topic and partition), the others are counted in
``figtank_limit_hits_total{limit="offsets.lag_series"}``.
"""

from __future__ import annotations

from typing import Final

import structlog
import trio

from gateway.core.contract import Backend
from gateway.core.metrics import GaugeCollector, Metrics, Samples
from gateway.kafka.groups.offsets import OffsetStore

log = structlog.get_logger("figtank.kafka.offsets")

#: Seconds between two refreshes of the high-water marks.
REFRESH_SECS: Final = 5.0


class CommittedLag:
    """The committed lag of every group and partition (bounded), for the metrics."""

    def __init__(self, store: OffsetStore, backend: Backend, metrics: Metrics,
                 max_series: int, *, register: bool = True) -> None:
        self._store = store
        self._backend = backend
        self._metrics = metrics
        self.max_series = max_series
        #: High-water mark by (topic, partition), as of the last refresh.
        self._hwm: dict[tuple[str, int], int] = {}
        self._logged = False
        if register:
            self._register(metrics)

    def _register(self, metrics: Metrics) -> None:
        store = self._store
        metrics.add_collector(GaugeCollector(
            "figtank_committed_lag_messages",
            "Messages between a partition's high-water mark and a group's committed "
            "offset (refreshed every few seconds).", ["group", "topic", "partition"],
            self.samples))
        metrics.add_collector(GaugeCollector(
            "figtank_committed_offsets", "Committed offsets kept (groups x partitions).",
            [], lambda: [([], float(store.entries))]))

    def _series(self) -> tuple[list[tuple[str, str, int, int]], int]:
        """The first ``max_series`` ``(group, topic, partition, offset)``, and how many
        more there are (safe to call from another thread: works on snapshots)."""
        chosen: list[tuple[str, str, int, int]] = []
        over = 0
        for group in sorted(list(self._store.groups())):
            for (topic, partition), c in sorted(self._store.committed(group).items()):
                if len(chosen) < self.max_series:
                    chosen.append((group, topic, partition, c.offset))
                else:
                    over += 1
        return chosen, over

    def samples(self) -> Samples:
        """The lag samples (scrape time, in the endpoint's worker thread)."""
        if self.max_series <= 0:
            return []
        chosen, over = self._series()
        if over:
            self._metrics.limit_hit("offsets.lag_series")
            if not self._logged:
                self._logged = True
                log.warning("offsets_limit_reached", limit="offsets.lag_series",
                            value=self.max_series, over=over,
                            action="the further series are not reported (logged once)")
        hwm = dict(self._hwm)
        return [([group, topic, str(partition)], float(max(hwm[(topic, partition)] - off, 0)))
                for group, topic, partition, off in chosen if (topic, partition) in hwm]

    async def refresh(self) -> None:
        """Look up the high-water marks of the reported series' topics."""
        topics = dict.fromkeys(t for _, t, _, _ in self._series()[0])
        hwm = {}
        for topic in topics:
            infos = await self._backend.discover_partitions(topic)
            for index, info in enumerate(infos or ()):
                hwm[(topic, index)] = info.high_water_mark
        self._hwm = hwm

    async def run(self) -> None:
        """Refresh every :data:`REFRESH_SECS` until cancelled (an unreachable upstream
        keeps the last marks)."""
        if self.max_series <= 0:
            return
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # the bridge's upstream down: try again later
                log.debug("committed_lag_refresh_failed", error=repr(exc))
            await trio.sleep(REFRESH_SECS)
