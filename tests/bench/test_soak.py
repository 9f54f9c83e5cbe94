"""The abuse soak (``python -m gateway.bench.soak``) in a few seconds: it runs every
abuser against a server it starts, measures, reads back and reports; it refuses targets
off loopback; and it fails when the server dies under it. The full soak is not part of
the suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from gateway.bench.serving import start_serve
from gateway.bench.soak.abusers import ABUSERS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: Every abuser, with footprints small enough for a test.
LIGHT = ["--seconds", "3", "--settle", "0.5", "--warm-up", "0.5", "--drain", "2",
         "--scale", "0.05", "--data-mib", "1", "--wide-partitions", "400",
         "--big-frame-send-mib", "2", "--big-frame-mib", "4", "--big-frame-interval", "0.5",
         "--stall-send-mib", "1", "--consume-hold", "1", "--max-server-rss", "2048"]


def soak(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.bench.soak", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_short_soak_runs_every_abuser_and_reports_the_figures() -> None:
    done = soak(*LIGHT, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["acknowledged_lost"] == 0
    server = report["server"]
    assert server["own"] and server["alive"] and server["health"] == 200
    assert server["health_after_abuse_seconds"] is not None
    for figure in ("rss_bytes", "descriptors"):
        values = report[figure]
        assert 0 < values["start"] <= values["peak"], (figure, values)
        assert values["final"] > 0
    assert report["samples"] >= 20  # every ~100 ms for over 3 s
    good = report["well_behaved"]
    for name in ("figg_publish_ack", "figg_ping", "tank_produce", "figg_to_tank_delivery"):
        stats = good["latency_ms"][name]
        assert stats["count"] > 0 and 0 < stats["p50"] <= stats["p99"] <= stats["max"], name
    for topic in good["topics"].values():
        assert topic["read_back"] and topic["acked"] > 10 and topic["lost"] == 0
    assert set(report["abusers"]) == set(ABUSERS)
    for name, tally in report["abusers"].items():
        assert tally["connections"] > 0, name
        assert not tally["error"], (name, tally["error"])
    abusers = report["abusers"]
    assert abusers["topic-flood"]["notes"]["wide_create"]["partitions"] == 20  # 400 scaled
    assert abusers["topic-flood"]["notes"].get("auto_topics_ok", 0) > 0
    assert abusers["sparse-sequence"]["notes"]["sparse_rounds"]
    assert abusers["big-frames"]["sent_bytes"] >= 2 * 1024 * 1024
    assert abusers["scrape-back-to-back"]["notes"]["scrapes_200"] > 0
    assert abusers["attach-flood"]["notes"]["attached"] > 0


def test_the_text_report_names_the_figures() -> None:
    done = soak(*LIGHT, "--only", "figg-version,http-oddities")
    assert done.returncode == 0, done.stderr[-3000:]
    for words in ("acknowledged lost:    0", "RSS:", "peak", "descriptors:", "p99",
                  "figg-version", "http-oddities", "PASS"):
        assert words in done.stdout, (words, done.stdout)


def test_targets_off_loopback_are_refused() -> None:
    done = soak("--pid", str(os.getpid()), "--figg", "192.0.2.1:8119",
                "--tank", "127.0.0.1:11011", "--metrics", "127.0.0.1:9464", timeout=30)
    assert done.returncode == 2
    assert "not a loopback address" in done.stderr


def wait_for_figg_connection(metrics: str, *, deadline: float) -> None:
    """Until the server at ``metrics`` reports an open Figg connection: the well-behaved
    client's (the soak's setup fills its topic over Tank first)."""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as answer:
            for line in answer.read().decode().splitlines():
                if (line.startswith("figtank_connections{") and 'protocol="figg"' in line
                        and float(line.split()[-1]) > 0):
                    return
        time.sleep(0.1)
    raise AssertionError("the soak's clients never connected")


def test_a_server_that_dies_fails_the_soak() -> None:
    with tempfile.TemporaryDirectory() as data:
        process, event, _ = start_serve(
            ["--data-dir", data, "--durability", "os", "--tank-listen", "127.0.0.1:0",
             "--figg-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        try:
            runner = subprocess.Popen(
                [sys.executable, "-m", "gateway.bench.soak", "--json", "--only", "none",
                 "--pid", str(process.pid), "--figg", event["figg"], "--tank", event["tank"],
                 "--metrics", event["metrics"], "--seconds", "3", "--settle", "0",
                 "--warm-up", "0", "--drain", "1"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
            # Killed once the well-behaved client is connected (on a busy machine the
            # runner can take seconds to start; killed before, it only fails to connect).
            wait_for_figg_connection(event["metrics"], deadline=time.monotonic() + 60)
            time.sleep(1)
            process.send_signal(signal.SIGKILL)
            out, err = runner.communicate(timeout=90)
        finally:
            process.kill()
            process.wait()
    assert runner.returncode == 1, err[-3000:]
    assert out, err[-3000:]
    report = json.loads(out)
    assert report["server"]["alive"] is False
    assert report["server"]["survived"] is False
    assert report["ok"] is False
