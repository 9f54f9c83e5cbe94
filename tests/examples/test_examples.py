"""Every program in examples/ run as a real process against a ``figtank serve`` process.

Each runs in an empty working directory of its own, with ``XDG_STATE_HOME`` in the test's
temporary directory, and must leave that working directory empty.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.serving import ServeProcess, figtank_serve

pytestmark = pytest.mark.slow

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
metrics = "127.0.0.1:0"
""")
    with figtank_serve("--config", str(config), "--kafka-listen", "127.0.0.1:0") as served:
        yield served
        assert served.stop() == 0


def address(where: tuple[str, int] | None) -> str:
    assert where is not None
    return f"{where[0]}:{where[1]}"


@dataclass
class Examples:
    """Runs examples in ``cwd`` with ``XDG_STATE_HOME`` = ``state``."""

    cwd: Path
    state: Path

    def env(self) -> dict[str, str]:
        return dict(os.environ, PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(self.state))

    def run(self, name: str, *args: str, timeout: float = 20, status: int = 0
            ) -> subprocess.CompletedProcess:
        """Run examples/``name`` to completion; it must exit with ``status``."""
        result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=self.cwd,
                                capture_output=True, text=True, timeout=timeout,
                                env=self.env())
        assert result.returncode == status, result.stderr
        return result

    def start(self, name: str, *args: str) -> subprocess.Popen:
        """Start examples/``name`` (stdout and stderr piped)."""
        return subprocess.Popen([sys.executable, str(EXAMPLES / name), *args],
                                cwd=self.cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env())


@pytest.fixture
def examples(tmp_path: Path) -> Iterator[Examples]:
    """An :class:`Examples`; afterwards the working directory must still be empty (no
    offset file, nothing)."""
    cwd, state = tmp_path / "cwd", tmp_path / "state"
    cwd.mkdir()
    yield Examples(cwd, state)
    assert list(cwd.iterdir()) == []


def stopped(process: subprocess.Popen, timeout: float = 15) -> tuple[str, str]:
    """Wait for ``process`` (killed if it does not end in time); its stdout and stderr."""
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def closed_port() -> int:
    """A loopback port nothing listens on (just released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fields(line: str) -> dict[str, str]:
    """``a=1 b=x`` -> {"a": "1", "b": "x"}."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def test_publisher_then_resuming_subscriber(server: ServeProcess, examples: Examples,
                                             tmp_path: Path) -> None:
    figg = ("--figg", address(server.figg), "--topic", "resume")
    published = examples.run("figg_publisher.py", *figg, "--count", "5")
    assert "published 5 messages to 'resume', 5 acknowledged" in published.stdout

    state = str(tmp_path / "resume.offset")
    subscriber = ("figg_resuming_subscriber.py", *figg, "--state", state, "--idle", "1")
    first = examples.run(*subscriber, "--count", "3").stdout.splitlines()
    assert (tmp_path / "resume.offset").read_text().strip() == "3"
    examples.run("figg_publisher.py", *figg, "--count", "2", "--prefix", "late")
    second = examples.run(*subscriber, "--count", "100").stdout.splitlines()
    third = examples.run(*subscriber).stdout.splitlines()  # nothing new: stops when idle

    seen = [(int(fields(line)["offset"]), fields(line)["data"]) for line in first + second]
    assert seen == [(1, "order-1"), (2, "order-2"), (3, "order-3"), (4, "order-4"),
                    (5, "order-5"), (6, "late-1"), (7, "late-2")]
    assert third == []


def test_tank_producer_and_following_consumer(server: ServeProcess,
                                             examples: Examples) -> None:
    tank = ("--tank", address(server.tank), "--topic", "follow")
    produced = examples.run("tank_producer.py", *tank, "--count", "7", "--batch", "3")
    assert "produced 7 messages to follow/0; high-water mark 7" in produced.stdout

    read = [fields(line) for line in examples.run("tank_consumer.py", *tank, "--from", "2",
                                             "--count", "4").stdout.splitlines()]
    assert [(m["seq"], m["key"], m["value"]) for m in read] == [
        ("2", "customer-2", "order-2"), ("3", "customer-0", "order-3"),
        ("4", "customer-1", "order-4"), ("5", "customer-2", "order-5")]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", m["time"]) for m in read)

    # A consumer at the tail long-polls until the producer appends.
    follower = examples.start("tank_consumer.py", *tank, "--from", "8", "--count", "2",
                              "--idle", "15")
    try:
        examples.run("tank_producer.py", *tank, "--count", "2")
    finally:
        out, err = stopped(follower)
    assert follower.returncode == 0, err
    assert [fields(line)["seq"] for line in out.splitlines()] == ["8", "9"]
    assert "received 2 messages; next sequence 10" in err


@pytest.mark.parametrize("split", ["1", "4"])
def test_handoff_has_no_gap_and_no_duplicate(server: ServeProcess, examples: Examples,
                                             split: str) -> None:
    result = examples.run("handoff.py", "--figg", address(server.figg), "--tank",
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


def test_handoff_runs_again_on_a_used_topic(server: ServeProcess, examples: Examples
                                            ) -> None:
    # Older messages in the partition: the hand-off uses the sequences it produced.
    args = ("--figg", address(server.figg), "--tank", address(server.tank),
            "--topic", "again", "--count", "3", "--split", "2")
    examples.run("handoff.py", *args)
    lines = examples.run("handoff.py", *args).stdout.splitlines()
    assert "figg stopped at offset 5: tank continues at sequence 6" in lines
    assert lines[-1] == "tank -> figg: no gap, no duplicate"


def test_resuming_subscriber_keeps_its_offset_out_of_the_working_directory(
        server: ServeProcess, examples: Examples) -> None:
    figg = ("--figg", address(server.figg), "--topic", "kept/0")
    examples.run("figg_publisher.py", *figg, "--count", "3")
    subscriber = ("figg_resuming_subscriber.py", *figg, "--idle", "1", "--count", "2")
    first = examples.run(*subscriber)
    # By default the offset goes to $XDG_STATE_HOME/figtank/, one file per topic.
    state = examples.state / "figtank" / "figg-kept-0.offset"
    assert state.read_text().strip() == "2"
    assert str(state) in first.stderr
    second = examples.run(*subscriber).stdout.splitlines()
    assert [fields(line)["offset"] for line in second] == ["3"]
    # (the fixture checks that the working directory stayed empty)


def one_line_failure(result: subprocess.CompletedProcess, name: str) -> str:
    """The single stderr line ``<name>: ...`` of a failed example (nothing on stdout)."""
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{name}: ")
    return lines[0]


def test_kafka_producer_then_consumer_at_the_mapped_positions(server: ServeProcess,
                                                             examples: Examples) -> None:
    kafka = ("--kafka", address(server.kafka), "--topic", "kafka-orders")
    produced = examples.run("kafka_producer.py", *kafka, "--count", "6",
                            "--compression", "zstd", timeout=30)
    assert ("produced 6 messages to kafka-orders/0; Kafka offsets 0..5 = "
            "Tank sequences 1..6") in produced.stdout
    read = [fields(line) for line in examples.run(
        "kafka_consumer.py", *kafka, "--from", "2", "--count", "3", timeout=30
    ).stdout.splitlines()]
    assert [(m["offset"], m["seq"], m["key"], m["value"]) for m in read] == [
        ("2", "3", "customer-0", "order-3"), ("3", "4", "customer-1", "order-4"),
        ("4", "5", "customer-2", "order-5")]
    # The same messages over Tank, at sequence = Kafka offset + 1.
    tank = [fields(line) for line in examples.run(
        "tank_consumer.py", "--tank", address(server.tank), "--topic", "kafka-orders",
        "--from", "3", "--count", "3").stdout.splitlines()]
    assert [(m["seq"], m["value"]) for m in tank] == [
        ("3", "order-3"), ("4", "order-4"), ("5", "order-5")]


@pytest.mark.parametrize("name, flags", [
    ("kafka_producer.py", ("--kafka",)),
    ("kafka_consumer.py", ("--kafka",)),
    ("tank_producer.py", ("--tank",)),
    ("tank_consumer.py", ("--tank",)),
    ("handoff.py", ("--tank", "--figg")),
    ("figg_publisher.py", ("--figg",)),
    ("figg_resuming_subscriber.py", ("--figg",)),
])
def test_example_against_a_closed_port_fails_with_one_line(
        examples: Examples, name: str, flags: tuple[str, ...]) -> None:
    nowhere = f"127.0.0.1:{closed_port()}"
    args = [arg for flag in flags for arg in (flag, nowhere)]
    result = examples.run(name, *args, timeout=30, status=1)
    line = one_line_failure(result, name.removesuffix(".py"))
    assert nowhere in line


def test_figg_publisher_refused_topic_fails_with_one_line(server: ServeProcess,
                                                          examples: Examples) -> None:
    # The server closes the connection on an invalid topic name; the client gives up
    # after a few refusals instead of reconnecting forever.
    started = time.monotonic()
    result = examples.run("figg_publisher.py", "--figg", address(server.figg), "--topic",
                          "bad name", timeout=30, status=1)
    assert time.monotonic() - started < 20
    assert "bad name" in one_line_failure(result, "figg_publisher")


@pytest.mark.parametrize("name, args", [
    ("figg_publisher.py", ("--figg", "nonsense")),
    ("handoff.py", ("--count", "3", "--split", "3")),
    ("kafka_consumer.py", ("--from", "-4")),
    ("spark_events.py", ("--figg", "nonsense", "publish")),
])
def test_example_with_bad_arguments_exits_2(examples: Examples, name: str,
                                            args: tuple[str, ...]) -> None:
    result = examples.run(name, *args, status=2)
    assert result.stdout == "" and "Traceback" not in result.stderr


def _tank_connections(server: ServeProcess) -> float:
    """Connections the server's Tank listener accepted so far."""
    assert server.metrics is not None
    with urllib.request.urlopen(f"http://{address(server.metrics)}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("figtank_connections_accepted_total{")
               and 'listener="tank"' in line)


def test_ctrl_c_ends_an_example_quietly_with_130(server: ServeProcess,
                                                 examples: Examples) -> None:
    before = _tank_connections(server)
    follower = examples.start("tank_consumer.py", "--tank", address(server.tank), "--topic",
                              "quiet", "--idle", "60")
    deadline = time.monotonic() + 60
    while _tank_connections(server) == before:  # not yet connected (a busy machine: slow)
        assert time.monotonic() < deadline, "the example never connected"
        time.sleep(0.1)
    time.sleep(0.5)  # its first long poll on its way
    follower.send_signal(signal.SIGINT)
    out, err = stopped(follower)
    assert follower.returncode == 130
    assert (out, err) == ("", "")
