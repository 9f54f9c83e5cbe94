"""The merge of the workers' metrics: sums, the gauges that are not, and the counts of a
worker gone."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.core.metrics import Metrics
from gateway.server.merging import MetricsMerger, Source

ONE, TWO = Source("0", 101), Source("1", 102)


def worker(n: int, *, up: int = 1) -> str:
    """A worker's rendering: ``n`` of everything."""
    metrics = Metrics()
    metrics.requests.labels("tank", "produce", "ok").inc(n)
    metrics.connections_accepted.labels("tank", "tank").inc(n)
    metrics.connections.labels("tank", "tank").inc(n)
    metrics.append_seconds.observe(0.001 * n)
    metrics.appended("orders", n, 10 * n)
    metrics.include(metrics.upstream_up)
    metrics.upstream_up.set(up)
    metrics.reader_lag.update("reader", "tank", "orders", 0, 1, n)
    return metrics.render().decode()


def values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition (which must parse), by name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def test_counters_histograms_and_most_gauges_are_sums() -> None:
    merged = values(MetricsMerger().render({ONE: worker(3), TWO: worker(4)}))
    tank = (("listener", "tank"), ("protocol", "tank"))
    assert merged[("figtank_requests_total", (("protocol", "tank"), ("result", "ok"),
                                              ("type", "produce")))] == 7
    assert merged[("figtank_connections_accepted_total", tank)] == 7
    assert merged[("figtank_connections", tank)] == 7
    assert merged[("figtank_messages_in_total", (("topic", "orders"),))] == 7
    assert merged[("figtank_bytes_in_total", (("topic", "orders"),))] == 70
    assert merged[("figtank_append_seconds_count", ())] == 2
    assert merged[("figtank_append_seconds_bucket", (("le", "+Inf"),))] == 2
    assert merged[("figtank_readers", (("partition", "0"), ("protocol", "tank"),
                                       ("topic", "orders")))] == 2


def test_gauges_of_the_shared_log_are_not_sums() -> None:
    merged = values(MetricsMerger().render({ONE: worker(3), TWO: worker(9, up=0)}))
    # The largest lag of any reader; the upstream up only when every worker has it.
    assert merged[("figtank_reader_lag_messages", (("partition", "0"), ("protocol", "tank"),
                                                   ("topic", "orders")))] == 9
    assert merged[("figtank_upstream_up", ())] == 0
    created = [v for (name, _), v in merged.items() if name == "figtank_requests_created"]
    assert len(created) == 1 and created[0] > 1e9  # the earliest, not a sum of times


def test_the_per_worker_series_name_each_pid_and_listener() -> None:
    merged = values(MetricsMerger().render({ONE: worker(3), TWO: worker(4)}))
    assert merged[("figtank_worker_connections_accepted_total",
                   (("listener", "tank"), ("pid", "101"), ("worker", "0")))] == 3
    assert merged[("figtank_worker_connections_accepted_total",
                   (("listener", "tank"), ("pid", "102"), ("worker", "1")))] == 4
    assert merged[("figtank_worker_connections",
                   (("listener", "tank"), ("pid", "102"), ("worker", "1")))] == 4


def test_a_worker_gone_keeps_its_counts_not_its_gauges() -> None:
    merger = MetricsMerger()
    merger.render({ONE: worker(3), TWO: worker(4)})
    merger.retire(ONE)
    replacement = Source("0", 103)
    merged = values(merger.render({replacement: worker(1), TWO: worker(4)}))
    tank = (("listener", "tank"), ("protocol", "tank"))
    # 3 counted by the one gone, 1 by its replacement, 4 by the other: never less.
    assert merged[("figtank_connections_accepted_total", tank)] == 8
    assert merged[("figtank_append_seconds_count", ())] == 3
    assert merged[("figtank_connections", tank)] == 5  # open now: only the living
    pids = {dict(labels)["pid"] for name, labels in merged
            if name == "figtank_worker_connections_accepted_total"}
    assert pids == {"102", "103"}


def test_the_supervisors_own_counts_are_merged_with_no_series_of_a_worker() -> None:
    own = Metrics()
    own.limit_hit("http_max_connections")
    merged = values(MetricsMerger().render({ONE: worker(1)}, own.render().decode()))
    assert merged[("figtank_limit_hits_total", (("limit", "http_max_connections"),))] == 1
    pids = {dict(labels)["pid"] for name, labels in merged
            if name == "figtank_worker_connections_accepted_total"}
    assert pids == {"101"}


def test_a_rendering_fetched_before_its_worker_went_is_not_counted_twice() -> None:
    merger = MetricsMerger()
    merger.render({ONE: worker(3), TWO: worker(4)})
    late = worker(5)  # fetched by a scrape while the worker was exiting
    merger.retire(ONE)
    merged = values(merger.render({ONE: late, TWO: worker(4)}))
    tank = (("listener", "tank"), ("protocol", "tank"))
    assert merged[("figtank_connections_accepted_total", tank)] == 7
    pids = {dict(labels)["pid"] for name, labels in merged
            if name == "figtank_worker_connections_accepted_total"}
    assert pids == {"102"}
