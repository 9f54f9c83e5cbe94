"""Every scenario at a tiny size against a figtank: counts and report fields (the figures
themselves are not asserted)."""

from __future__ import annotations

import json

import pytest

from gateway.bench.command import BenchError, bench
from gateway.bench.report import Report
from gateway.cli.main import main


def check_report(report: Report, scenario: str, rows: int) -> None:
    assert report.ok, report.table()
    assert report.scenario == scenario
    assert report.target == "figtank-test"
    assert len(report.rows) == rows
    assert report.version
    data = report.to_dict()
    assert data["ok"] is True
    assert data["params"]["scenario"] == scenario
    assert {"cpu", "cpus", "python"} <= data["machine"].keys()
    assert {"procs", "cpu_s", "wall_s", "busy_cores", "busiest_proc"} <= \
        data["generator"].keys()
    for row in data["rows"]:
        assert row["seconds"] > 0
        assert {"msgs_per_s", "mb_per_s", "messages", "latency"} <= row.keys()
    json.dumps(data)  # a machine can read all of it
    assert scenario in report.table()


def test_tank_produce(endpoints: list[str]) -> None:
    report = bench(["tank-produce", "--messages", "1050", "--bundle", "100", *endpoints])
    check_report(report, "tank-produce", 1)
    [row] = report.rows
    assert row.messages == 1050
    assert row.payload_bytes == 1050 * 100
    assert row.latency is not None and row.latency["count"] == 11  # 10 full + 1 short
    assert report.server is not None  # --server-pid was given
    [check] = report.checks
    assert (check.expected, check.received) == (1050, 1050)


def test_tank_produce_over_two_processes_compressed(endpoints: list[str]) -> None:
    report = bench(["tank-produce", "--messages", "900", "--bundle", "200", "--procs", "2",
                    "--compression", "snappy", "--compressible", "--client-encode",
                    *endpoints])
    check_report(report, "tank-produce", 1)
    assert report.generator["procs"] == 2
    assert report.rows[0].messages == 900


def test_tank_consume(endpoints: list[str]) -> None:
    report = bench(["tank-consume", "--messages", "1000", "--size", "200",
                    "--fetch-size", "4096", "--procs", "2", *endpoints])
    check_report(report, "tank-consume", 1)
    assert report.rows[0].messages == 1000
    assert report.rows[0].payload_bytes == 200_000
    assert report.params["first_seq"] == 1 and report.params["last_seq"] == 1000


def test_tank_consume_raw_counts_from_bundle_headers(endpoints: list[str]) -> None:
    report = bench(["tank-consume", "--messages", "1000", "--bundle", "30", "--raw",
                    "--fetch-size", "2000", "--procs", "2", *endpoints])
    check_report(report, "tank-consume", 1)
    [row] = report.rows
    assert row.label == "consume (raw chunks)" and row.messages == 1000
    assert row.payload_bytes > 1000 * 1000  # chunk bytes: payloads and framing


def test_tank_consume_of_an_existing_topic(endpoints: list[str]) -> None:
    first = bench(["tank-consume", "--messages", "300", *endpoints])
    topic = first.params["topic"]
    again = bench(["tank-consume", "--existing", "--topic", topic, *endpoints])
    check_report(again, "tank-consume", 1)
    assert again.rows[0].messages == 300


def test_a_short_read_is_reported_and_exits_non_zero(endpoints: list[str], capsys) -> None:
    # The topic holds 200 messages, the run is told to expect 203: three are "lost".
    code = main(["bench", "tank-consume", "--messages", "200", "--expect", "203",
                 *endpoints])
    out, err = capsys.readouterr()
    assert code == 1
    assert "200 of 203 messages, 3 lost" in out and "FAILED" in out
    assert "lost or duplicated" in err


def test_figg_publish(endpoints: list[str]) -> None:
    report = bench(["figg-publish", "--messages", "1001", "--publishers", "2", *endpoints])
    check_report(report, "figg-publish", 1)
    assert report.rows[0].messages == 1001
    assert report.rows[0].latency_of == "ack"
    assert [c.what for c in report.checks] == ["acknowledged", "read back from offset 0"]
    assert all(c.received == 1001 for c in report.checks)


def test_figg_subscribe(endpoints: list[str]) -> None:
    report = bench(["figg-subscribe", "--messages", "600", "--backlog", "400",
                    "--publishers", "1", "--live", "2", "--resuming", "1", "--procs", "2",
                    *endpoints])
    check_report(report, "figg-subscribe", 3)
    publish, live, resuming = report.rows
    assert publish.messages == 600
    assert live.label == "live subscribers (2)" and live.messages == 2 * 600
    assert resuming.label == "resuming subscribers (1)" and resuming.messages == 1000
    assert [c.expected for c in report.checks] == [600, 1200, 1000]


def test_e2e(endpoints: list[str]) -> None:
    report = bench(["e2e", "--rate", "400", "--duration", "0.25", *endpoints])
    check_report(report, "e2e", 4)
    assert [row.label for row in report.rows] == ["figg->tank", "tank->figg", "figg->figg",
                                                  "tank->tank"]
    for row in report.rows:
        assert row.messages == 100
        assert row.latency is not None
        assert {"p50", "p99", "p999", "max"} <= row.latency.keys()


def test_e2e_over_two_processes(endpoints: list[str]) -> None:
    report = bench(["e2e", "--rate", "400", "--duration", "0.25", "--procs", "2",
                    "--paths", "figg-tank", "tank-figg", *endpoints])
    check_report(report, "e2e", 2)
    assert [row.messages for row in report.rows] == [100, 100]


def test_loopback(endpoints: list[str]) -> None:
    report = bench(["loopback", "--duration", "0.2", "--write-size", "65536", *endpoints])
    check_report(report, "loopback", 1)
    assert report.checks[0].unit == "bytes"
    assert report.rows[0].payload_bytes == report.checks[0].expected > 0


def test_json_output(endpoints: list[str], capsys) -> None:
    code = main(["bench", "tank-produce", "--messages", "100", "--json", *endpoints])
    out, _ = capsys.readouterr()
    assert code == 0
    data = json.loads(out)
    assert data["scenario"] == "tank-produce" and data["ok"] is True
    assert data["figtank_version"]
    assert data["params"]["messages"] == 100 and data["params"]["bundle"] == 100
    assert data["rows"][0]["messages"] == 100


def test_an_unreachable_endpoint_is_a_runtime_failure(capsys) -> None:
    code = main(["bench", "tank-produce", "--tank", "127.0.0.1:1", "--messages", "10"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "figtank bench:" in err


def test_bad_options_are_refused() -> None:
    with pytest.raises(BenchError, match="--size"):
        bench(["figg-publish", "--size", "8"])
    with pytest.raises(BenchError, match="--procs"):
        bench(["figg-publish", "--publishers", "1", "--procs", "2"])
