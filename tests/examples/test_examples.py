"""Every program in examples/ run as a real process against a ``figtank serve`` process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving import ServeProcess, figtank_serve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One gateway for the whole module (each test uses its own topics)."""
    directory = tmp_path_factory.mktemp("serve")
    config = directory / "figtank.toml"
    config.write_text(f"""
[store]
data_dir = "{directory / 'data'}"
[listen]
tank = "127.0.0.1:0"
figg = "127.0.0.1:0"
metrics = ""
""")
    with figtank_serve("--config", str(config)) as served:
        yield served
        assert served.stop() == 0


def address(where: tuple[str, int] | None) -> str:
    assert where is not None
    return f"{where[0]}:{where[1]}"


def example(name: str, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """Run examples/``name`` to completion; it must exit 0."""
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr
    return result


def fields(line: str) -> dict[str, str]:
    """``a=1 b=x`` -> {"a": "1", "b": "x"}."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def test_publisher_then_resuming_subscriber(server: ServeProcess, tmp_path: Path) -> None:
    figg = ("--figg", address(server.figg), "--topic", "resume")
    published = example("figg_publisher.py", *figg, "--count", "5")
    assert "published 5 messages to 'resume', 5 acknowledged" in published.stdout

    state = str(tmp_path / "resume.offset")
    subscriber = ("figg_resuming_subscriber.py", *figg, "--state", state, "--idle", "1")
    first = example(*subscriber, "--count", "3").stdout.splitlines()
    assert (tmp_path / "resume.offset").read_text().strip() == "3"
    example("figg_publisher.py", *figg, "--count", "2", "--prefix", "late")
    second = example(*subscriber, "--count", "100").stdout.splitlines()
    third = example(*subscriber).stdout.splitlines()  # nothing new: stops when idle

    seen = [(int(fields(line)["offset"]), fields(line)["data"]) for line in first + second]
    assert seen == [(1, "order-1"), (2, "order-2"), (3, "order-3"), (4, "order-4"),
                    (5, "order-5"), (6, "late-1"), (7, "late-2")]
    assert third == []


def test_tank_producer_and_following_consumer(server: ServeProcess) -> None:
    tank = ("--tank", address(server.tank), "--topic", "follow")
    produced = example("tank_producer.py", *tank, "--count", "7", "--batch", "3")
    assert "produced 7 messages to follow/0; high-water mark 7" in produced.stdout

    read = [fields(line) for line in example("tank_consumer.py", *tank, "--from", "2",
                                             "--count", "4").stdout.splitlines()]
    assert [(m["seq"], m["key"], m["value"]) for m in read] == [
        ("2", "customer-2", "order-2"), ("3", "customer-0", "order-3"),
        ("4", "customer-1", "order-4"), ("5", "customer-2", "order-5")]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", m["time"]) for m in read)

    # A consumer at the tail long-polls until the producer appends.
    follower = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "tank_consumer.py"), *tank, "--from", "8",
         "--count", "2", "--idle", "15"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert follower.stdout is not None
        example("tank_producer.py", *tank, "--count", "2")
        out, err = follower.communicate(timeout=15)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert [fields(line)["seq"] for line in out.splitlines()] == ["8", "9"]
    assert "received 2 messages; next sequence 10" in err


@pytest.mark.parametrize("split", ["1", "4"])
def test_handoff_has_no_gap_and_no_duplicate(server: ServeProcess, split: str) -> None:
    result = example("handoff.py", "--figg", address(server.figg), "--tank",
                     address(server.tank), "--topic", f"handoff{split}", "--count", "8",
                     "--split", split)
    lines = result.stdout.splitlines()
    assert "figg -> tank: no gap, no duplicate" in lines
    assert "tank -> figg: no gap, no duplicate" in lines
    # Each direction reads 1..8 once: first over one protocol, then over the other.
    read = [int(fields(line).get("offset") or fields(line)["seq"]) for line in lines
            if line.startswith(("figg offset=", "tank seq="))]
    assert read == [*range(1, 9), *range(1, 9)]
    k = int(split)
    assert all(line.startswith("figg") for line in lines[:k])
    assert f"figg stopped at offset {k}: tank continues at sequence {k + 1}" in lines
    assert f"tank stopped at sequence {k}: figg attaches with offset {k}" in lines


def test_handoff_runs_again_on_a_used_topic(server: ServeProcess) -> None:
    # Older messages in the partition: the hand-off uses the sequences it produced.
    args = ("--figg", address(server.figg), "--tank", address(server.tank),
            "--topic", "again", "--count", "3", "--split", "2")
    example("handoff.py", *args)
    lines = example("handoff.py", *args).stdout.splitlines()
    assert "figg stopped at offset 5: tank continues at sequence 6" in lines
    assert lines[-1] == "tank -> figg: no gap, no duplicate"
