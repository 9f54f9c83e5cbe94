"""The helpers: payloads and the tally, percentiles, shares, the suite's table."""

from __future__ import annotations

import pytest

from gateway.bench.payload import HEADER_SIZE, Payloads, Tally, read_stamp
from gateway.bench.procs import Share
from gateway.bench.stats import percentile, stride, summarize
from gateway.bench.suite import markdown, run_suite


def test_payloads_are_seeded_and_sized() -> None:
    a, b = Payloads(7, 100), Payloads(7, 100)
    assert a.body(5) == b.body(5) and len(a.body(5)) == 100
    assert a.body(5) != a.body(6)
    assert Payloads(8, 100).body(5) != a.body(5)
    stamped = a.stamped(1, 2, 3, 4)
    assert len(stamped) == 100 and read_stamp(stamped) == (1, 2, 3, 4)
    with pytest.raises(ValueError):
        Payloads(1, HEADER_SIZE - 1).stamped(1, 2, 3, 4)


def test_tally_finds_losses_duplicates_and_foreigners() -> None:
    p = Payloads(1, 40)
    tally = Tally(9, {0: 3, 1: 2})
    for publisher, index in [(0, 0), (0, 1), (0, 1), (1, 0), (1, 1)]:
        assert tally.add(p.stamped(9, publisher, index, 123)) == 123
    assert tally.add(p.stamped(8, 0, 2, 0)) == -1  # another run
    assert tally.add(p.stamped(9, 5, 0, 0)) == -1  # an unknown publisher
    assert tally.summary() == {"expected": 5, "received": 4, "lost": 1, "duplicates": 1,
                               "foreign": 2}
    assert not tally.complete


def test_percentiles() -> None:
    values = [i / 1000 for i in range(1, 1001)]
    assert percentile(values, 0.5) == 0.5
    assert percentile(values, 0.999) == 0.999
    summary = summarize(reversed(values))
    assert summary is not None
    assert summary["max"] == 1.0 and summary["p99"] == 0.99 and summary["count"] == 1000
    assert summarize([]) is None
    assert stride(100, 10) == 10 and stride(5, 10) == 1


def test_shares_split_the_load() -> None:
    shares = [Share(i, 3) for i in range(3)]
    assert [s.part(10) for s in shares] == [(0, 4), (4, 3), (7, 3)]
    assert [s.mine(4) for s in shares] == [[0, 3], [1], [2]]


def test_the_suite_against_a_running_broker(figtank) -> None:
    results = run_suite(scale=0.002, target="figtank-test", tank=figtank.tank,
                        figg=figtank.figg, kafka=figtank.kafka)
    cases = [run["case"] for run in results["runs"]]
    assert cases[0] == "loopback first" and cases[-1] == "loopback last"
    assert "e2e 1000/s" in cases and "kafka-consume 1 KB" in cases and len(cases) == 12
    assert all("report" in run and run["report"]["ok"] for run in results["runs"])
    table = markdown(results)
    assert "| tank-produce 100 B | - | produce |" in table
    assert "% of loopback" in table
