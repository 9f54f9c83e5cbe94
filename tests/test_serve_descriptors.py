"""``figtank serve`` and the descriptor limit (issue 15, item 1): start-up raises the soft
RLIMIT_NOFILE to what the data directory needs (and more, up to the hard limit), or exits 2
with one line saying how many descriptors are needed."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from gateway.client.tank_blocking import BlockingTankClient

TOPICS = 40
#: 2 per partition + 64 (docs/limits.md, "Descriptors").
NEEDED = 2 * TOPICS + 64


def data_dir_with_topics(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    for i in range(TOPICS):
        (data / f"topic{i:02d}" / "0").mkdir(parents=True)
    return data


def serve(data: Path, soft: int, hard: int, *flags: str) -> subprocess.Popen:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    command = [sys.executable, "-m", "gateway.cli", "serve", "--log-format", "json",
               "--data-dir", str(data), "--tank-listen", "127.0.0.1:0", "--figg-listen", "",
               "--metrics-listen", "", "--kafka-listen", "", "--http-listen", "", *flags]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=limit,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def soft_limit_of(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no descriptor limit in /proc/<pid>/limits")


def test_start_up_raises_the_soft_limit_and_serves(tmp_path: Path) -> None:
    data = data_dir_with_topics(tmp_path)
    process = serve(data, NEEDED - 40, NEEDED + 200)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            event = json.loads(line)
            if event["event"] == "figtank_serving":
                break
        else:
            raise AssertionError(f"exited {process.wait()} without serving")
        # Wanted: what the data directory needs + rolled files + connections; capped at
        # the hard limit.
        assert soft_limit_of(process.pid) == NEEDED + 200
        host, _, port = event["tank"].rpartition(":")
        with BlockingTankClient(host, int(port), request_timeout=10) as client:
            client.produce({(f"topic{i:02d}", 0): [b"x"] for i in range(TOPICS)})
            assert [m.value for m in client.consume("topic39", 0, 1).messages] == [b"x"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def test_a_hard_limit_below_what_the_data_directory_needs_is_one_line(tmp_path: Path
                                                                       ) -> None:
    data = data_dir_with_topics(tmp_path)
    process = serve(data, NEEDED - 40, NEEDED - 20)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert stderr.splitlines() == [
        f"figtank: configuration error: limits.open_files: the data directory needs {NEEDED} "
        f"descriptors (2 for each of its {TOPICS} partitions + 64), more than the hard "
        f"descriptor limit (RLIMIT_NOFILE) {NEEDED - 20}; raise the hard limit (ulimit -Hn, "
        f"LimitNOFILE= in systemd) to {NEEDED} or more"]


def test_limits_open_files_below_the_need_is_one_line(tmp_path: Path) -> None:
    data = data_dir_with_topics(tmp_path)
    config = tmp_path / "figtank.toml"
    config.write_text(f"[limits]\nopen_files = {NEEDED - 1}\n")
    process = serve(data, NEEDED + 10, NEEDED + 100, "--config", str(config))
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    [line] = stderr.splitlines()
    assert line.endswith(f"needs {NEEDED} descriptors (2 for each of its {TOPICS} partitions "
                         f"+ 64), more than limits.open_files={NEEDED - 1}; raise it")


def test_topics_config_below_the_minimum_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text('[topics.config]\n"log.segment.bytes" = "64"\n')
    process = serve(tmp_path / "data", 1024, 4096, "--config", str(config))
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert stderr.splitlines() == [
        "figtank: configuration error: topics.config: bad value '64' for "
        "'log.segment.bytes': log.segment.bytes=64 is below the minimum 65536"]
