"""Appends, deliveries, requests and other loop counts are plain totals moved into their
counters when the metrics are rendered: every count shows, once, in each rendering after
it."""

from __future__ import annotations

import threading

from gateway.core.metrics import Metrics, RequestCounter
from tests.test_metric_topics import samples


def test_totals_show_in_every_rendering_once() -> None:
    metrics = Metrics(metric_topics=1)
    tank = RequestCounter(metrics, "tank")
    metrics.appended("a", 3, 300)
    metrics.appended("b", 1, 10)  # over the limit: _other
    tank.inc("produce")
    tank.inc("produce")
    tank.inc("produce", False)
    assert metrics.messages_in.labels("a")._value.get() == 0  # not moved yet
    text = metrics.render().decode()
    assert samples(text, "figtank_messages_in_total") == {'topic="a"': 3, 'topic="_other"': 1}
    assert samples(text, "figtank_bytes_in_total") == {'topic="a"': 300, 'topic="_other"': 10}
    requests = samples(text, "figtank_requests_total")
    assert requests == {'protocol="tank",result="ok",type="produce"': 2,
                        'protocol="tank",result="error",type="produce"': 1}
    assert metrics.render().decode() == text  # nothing new: nothing counted twice
    metrics.appended("a", 2, 20)
    metrics.appended("c", 5, 50)
    tank.inc("consume")
    text = metrics.render().decode()
    assert samples(text, "figtank_messages_in_total") == {'topic="a"': 5, 'topic="_other"': 6}
    assert samples(text, "figtank_requests_total")[
        'protocol="tank",result="ok",type="consume"'] == 1


def test_deliveries_and_loop_counts_show_once_and_share_a_child() -> None:
    metrics = Metrics(metric_topics=1)
    metrics.include(metrics.upstream_feed_pushes)
    pushes = metrics.loop_count(metrics.upstream_feed_pushes)
    assert metrics.loop_count(metrics.upstream_feed_pushes) is pushes
    metrics.sent("a").add(2, 64)
    metrics.sent("b").add(1, 8)  # over the limit: _other
    metrics.sent("c").add(4, 16)  # _other too: the same child, so the same count
    pushes.inc(3)
    assert metrics.messages_out.labels("a")._value.get() == 0  # not moved yet
    text = metrics.render().decode()
    assert samples(text, "figtank_messages_out_total") == {'topic="a"': 2, 'topic="_other"': 5}
    assert samples(text, "figtank_bytes_out_total") == {'topic="a"': 64, 'topic="_other"': 24}
    assert metrics.registry.get_sample_value("figtank_upstream_feed_pushes_total") == 3
    assert metrics.render().decode() == text
    metrics.sent("a").add(1, 1)
    pushes.inc()
    text = metrics.render().decode()
    assert samples(text, "figtank_messages_out_total")['topic="a"'] == 3
    assert metrics.registry.get_sample_value("figtank_upstream_feed_pushes_total") == 4


def test_renderings_in_threads_while_the_loop_counts() -> None:
    metrics = Metrics()
    counter = RequestCounter(metrics, "kafka")
    stop = threading.Event()

    def render() -> None:
        while not stop.is_set():
            metrics.render()

    threads = [threading.Thread(target=render) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20_000):
            metrics.appended("t", 1, 2)
            counter.inc("fetch")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    text = metrics.render().decode()
    assert samples(text, "figtank_messages_in_total") == {'topic="t"': 20_000}
    assert samples(text, "figtank_bytes_in_total") == {'topic="t"': 40_000}
    assert samples(text, "figtank_requests_total") == {
        'protocol="kafka",result="ok",type="fetch"': 20_000}


def test_loop_histogram_renders_as_prometheus_client_histogram() -> None:
    import random

    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from gateway.core.metrics import _LATENCY_BUCKETS

    metrics = Metrics()
    registry = CollectorRegistry()
    reference = Histogram("figtank_append_seconds", "Time from append request to "
                          "acknowledgement.", buckets=_LATENCY_BUCKETS, registry=registry)
    rng = random.Random(5)
    values = [*_LATENCY_BUCKETS, 0.0, 1e-9, 99.0] + [rng.expovariate(500) for _ in range(500)]
    for value in values:
        metrics.append_seconds.observe(value)
        reference.observe(value)

    def lines(text: str) -> list[str]:
        return sorted(line for line in text.splitlines()
                      if line.startswith("figtank_append_seconds") and "_created" not in line)

    want = lines(generate_latest(registry).decode())
    assert len(want) == len(_LATENCY_BUCKETS) + 3  # the buckets, +Inf, count and sum
    assert lines(metrics.render().decode()) == want
