"""The Spark examples as real processes: Ctrl-C stops the streaming one cleanly (status 130,
no traceback), and a failure is one line with status 1. Each starts a JVM: keep them few."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.spark.helpers import BackgroundServer
from tests.spark.jvm import spark_process_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example_env() -> dict[str, str]:
    """The environment of a user of the venv: no PYSPARK_PYTHON."""
    return spark_process_env(ROOT)


def high_water_mark(server: BackgroundServer, topic: str) -> int:
    """The topic's partition 0 high-water mark (0 while it does not exist)."""
    from gateway.client.errors import UnknownTopicError

    with server.client() as client:
        try:
            return client.discover_partitions(topic, [0])[0].high_water_mark
        except UnknownTopicError:
            return 0


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc; empty where there is none)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def gone(pids: list[int], timeout: float = 20) -> bool:
    """Whether every process of ``pids`` ends within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_ctrl_c_stops_the_stream_aggregate_with_130_and_no_traceback(
        server: BackgroundServer, tmp_path: Path) -> None:
    # Its own process group, signalled as a whole: what Ctrl-C in a terminal does.
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "spark_stream_aggregate.py"), "--endpoint",
         server.endpoint, "--input", "agg-in", "--output", "agg-out", "--checkpoint",
         str(tmp_path / "checkpoint"), "--trigger", "200 milliseconds"],
        cwd=tmp_path, env=example_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)
    reader.start()
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("aggregating agg-in -> agg-out")
        # The query runs (its workers run this Python): events in, aggregates out.
        deadline = time.monotonic() + 90
        with server.client() as client:
            while high_water_mark(server, "agg-out") == 0:
                assert time.monotonic() < deadline, "".join(errors)
                client.produce({("agg-in", 0): [
                    json.dumps({"key": f"sensor-{i % 2}", "amount": 1.5}).encode()
                    for i in range(10)]})
                time.sleep(0.5)
        jvm = children(process.pid)  # the JVM runs in a session of its own
        assert jvm
        os.killpg(process.pid, signal.SIGINT)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(5)
    assert process.returncode == 130, "".join(errors)
    assert out == ""
    assert not any("Traceback" in line for line in errors), "".join(errors)
    assert len(errors) <= 1, "".join(errors)
    assert gone(jvm)  # Spark is stopped with it
    aggregate = json.loads(_first_value(server, "agg-out"))
    assert aggregate["key"] in ("sensor-0", "sensor-1") and aggregate["events"] >= 5


def _first_value(server: BackgroundServer, topic: str) -> bytes:
    with server.client() as client:
        return client.consume(topic, 0, 1).messages[0].value


def test_batch_history_without_the_topic_fails_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "spark_batch_history.py"), "--data-dir",
         str(tmp_path / "nothing"), "--topic", "events"],
        cwd=tmp_path, env=example_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"spark_batch_history: no topic 'events' in {tmp_path / 'nothing'}"]
