"""``figtank bench http-fanout`` at a tiny size against a figtank with its HTTP listener:
every subscriber gets every message once, and the report has its rows and notes."""

from __future__ import annotations

from gateway.bench.command import bench
from gateway.bench.serving import serve_figtank
from tests.bench.test_scenarios import check_report


def test_http_fanout() -> None:
    with serve_figtank("--http-listen", "127.0.0.1:0", durability="os") as served:
        report = bench(["http-fanout", "--http", served.http, "--subscribers", "20",
                        "--rate", "200", "--duration", "0.5", "--sample-every", "5",
                        "--target", "figtank-test", "--server-pid",
                        str(served.process.pid)])
    check_report(report, "http-fanout", 3)
    sse, ws, both = report.rows
    assert sse.messages == ws.messages == 100 * 20
    assert both.messages == 100 * 40
    assert both.latency is not None and both.latency["count"] == 100 * 8
    assert [c.received for c in report.checks] == [4000, 40]
    assert any("per idle subscriber" in note and "KiB" in note for note in report.notes)
