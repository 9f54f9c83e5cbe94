"""The upstream-kafka scenario at a tiny size: it starts its own upstream (a ``figtank
serve`` with its Kafka listener, or Tansu) and a gateway in upstream-Kafka mode, drives
confluent-kafka straight at the upstream and the Figg and Tank clients through the
gateway, and reports each path with the counts checked against what the upstream holds.
The figures themselves are not asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gateway.bench.command import BenchError, bench
from gateway.cli.main import main
from tests.bench.test_scenarios import check_report

MESSAGES = 300
LATENCY_MESSAGES = 20
SIZE = 64
PATHS = ("direct librdkafka", "figtank Figg", "figtank Tank")


@pytest.mark.parametrize("upstream", ["figtank", "tansu"])
def test_upstream_kafka_reports_every_path_with_matching_counts(upstream: str) -> None:
    report = bench(["upstream-kafka", "--upstream", upstream,
                    "--messages", str(MESSAGES), "--size", str(SIZE),
                    "--latency-messages", str(LATENCY_MESSAGES), "--target", "figtank-test",
                    "--timeout", "120", "--stall", "10"])
    check_report(report, "upstream-kafka", 9)
    labels = [row.label for row in report.rows]
    assert labels == [f"{kind} {path}" for kind in ("produce", "consume",
                                                    "publish 1 at a time")
                      for path in PATHS]
    for row in report.rows[:6]:
        assert (row.messages, row.payload_bytes) == (MESSAGES, MESSAGES * SIZE), row.label
    for row in report.rows[6:]:
        assert row.messages == LATENCY_MESSAGES
        assert row.latency_of == "ack"
        assert row.latency is not None and row.latency["count"] == LATENCY_MESSAGES
    assert report.rows[0].latency is not None
    assert report.rows[0].latency["count"] == MESSAGES  # one delivery report each
    # Every path's messages are in the upstream once, and every reader read them all.
    held = [c for c in report.checks if "held by the upstream" in c.what]
    assert [(c.expected, c.received) for c in held] == \
        [(MESSAGES + LATENCY_MESSAGES, MESSAGES + LATENCY_MESSAGES)] * 3
    read = [c for c in report.checks if "read from the first offset" in c.what]
    assert [(c.expected, c.received, c.duplicates) for c in read] == [(MESSAGES, MESSAGES,
                                                                       0)] * 3
    figures = report.figures
    assert set(figures["produce_ratio"]) == set(figures["consume_ratio"]) == {"figg", "tank"}
    assert figures["produce_ratio"]["figg"] == pytest.approx(
        report.rows[1].rate / report.rows[0].rate)
    assert set(figures["publish_latency"]) == {"direct", "figg", "tank"}
    assert figures["added_p99_ms"]["tank"] == pytest.approx(
        figures["publish_latency"]["tank"]["p99_ms"]
        - figures["publish_latency"]["direct"]["p99_ms"])
    data = report.to_dict()
    assert data["figures"] == figures
    json.dumps(data)
    said = {"figtank": "a figtank serve process", "tansu": "the upstream is Tansu 0.6.0"}
    assert any(said[upstream] in note for note in report.notes)
    assert "added p99" in report.table()


def test_upstream_kafka_without_the_latency_phase() -> None:
    report = bench(["upstream-kafka", "--messages", "50", "--latency-messages", "0",
                    "--target", "figtank-test", "--timeout", "120", "--stall", "10"])
    check_report(report, "upstream-kafka", 6)
    assert "added_p99_ms" not in report.figures
    assert all(c.expected == 50 for c in report.checks)


@pytest.mark.parametrize("options", [["--procs", "2"], ["--size", "8"],
                                     ["--fetch-size", "0"], ["--tls"]])
def test_upstream_kafka_refuses_options_it_can_not_honour(options: list[str]) -> None:
    with pytest.raises(BenchError):
        bench(["upstream-kafka", *options])


def test_upstream_kafka_bad_option_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    assert main(["bench", "upstream-kafka", "--procs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("figtank bench: ") and "--procs 1" in err
    assert err.count("\n") == 1


def _stand_in(path: Path, body: str) -> str:
    """An executable script standing in for a peer's client (the real ones are built
    outside the project): it notes each address it was pointed at in ``<path>.log``."""
    path.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n"
                    f"log = open({str(path) + '.log'!r}, 'a')\n{body}")
    path.chmod(0o755)
    return str(path)


def test_the_peers_clients_run_straight_and_through_the_gateway(tmp_path: Path) -> None:
    figg_bench = _stand_in(tmp_path / "figg-bench", """
address = args[args.index("--addr") + 1]
log.write(address + "\\n")
log.flush()
rate = 1000 if len(open(log.name).read().split()) == 1 else 500
print(f"  pub stats: {rate:,} msgs/sec ~ 1 MB/sec\\n  sub stats: {rate:,} msgs/sec ~ 1 MB/sec")
""")
    tank_cli = _stand_in(tmp_path / "tank-cli", """
log.write(args[args.index("-b") + 1] + "\\n")
if "bm" in args:
    count = int(args[args.index("-c") + 1])
    print(f"Got ACK after publishing {count:,} message(s) of size 100b (1mb), took 2ms")
""")
    report = bench(["upstream-kafka", "--messages", "50", "--latency-messages", "0",
                    "--figg-bench", figg_bench, "--tank-cli", tank_cli,
                    "--target", "figtank-test", "--timeout", "120", "--stall", "10"])
    labels = [row.label for row in report.rows[6:]]
    assert labels == [f"{what} {side}" for what in (
        "figg-bench publish", "figg-bench subscribe",
        "tank-cli bm p2b (100 B, bundles of 1000)")
        for side in ("straight at the upstream", "through figtank")]
    assert report.figures["peer_ratio"]["figg-bench publish"] == pytest.approx(0.5)
    assert report.figures["peer_ratio"]["tank-cli bm p2b (100 B, bundles of 1000)"] == 1.0
    assert set(report.figures["peer_gateway_cpu_us_per_msg"]) == set(
        report.figures["peer_ratio"])
    # Each client went to two listeners: the upstream figtank's, then the gateway's.
    figg_to = (tmp_path / "figg-bench.log").read_text().split()
    tank_to = (tmp_path / "tank-cli.log").read_text().split()
    assert len(figg_to) == 2 and figg_to[0] != figg_to[1]
    assert len(set(tank_to)) == 2 and tank_to[0] != tank_to[-1]


def test_the_peers_clients_need_a_figtank_upstream(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="figtank upstream"):
        bench(["upstream-kafka", "--upstream", "tansu", "--figg-bench", "figg-bench"])
