"""The client subcommands of ``figtank``, each run as a real process against ``figtank serve``."""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gateway.store import inspect
from protocols.errors import ProtocolError
from protocols.tank.bundle import Message, encode_bundle, frame_bundle
from tests.serving import ServeProcess, figtank_serve

pytestmark = pytest.mark.slow


def figtank(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def json_lines(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def addr(address: tuple[str, int] | None) -> str:
    assert address is not None
    return f"{address[0]}:{address[1]}"


def metric(server: ServeProcess, line_start: str) -> float:
    assert server.metrics is not None
    with urllib.request.urlopen(f"http://{addr(server.metrics)}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starting with {line_start!r}")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "figtank.toml"
    path.write_text(f"""
[store]
data_dir = "{tmp_path / 'data'}"
durability = "fsync"
[listen]
tank = "127.0.0.1:0"
figg = "127.0.0.1:0"
metrics = "127.0.0.1:0"
""")
    return path


def test_publish_over_figg_consume_over_tank(config: Path, tmp_path: Path) -> None:
    with figtank_serve("--config", str(config)) as server:
        figg, tank = addr(server.figg), addr(server.tank)
        published = figtank("publish", "--figg", figg, "--json", "orders", "a", "b", "c")
        assert json_lines(published) == [{"topic": "orders", "published": 3}]

        consumed = json_lines(figtank("consume", "--tank", tank, "--json", "orders"))
        assert [(m["seq"], m["value"]) for m in consumed] == [(1, "a"), (2, "b"), (3, "c")]
        # --from: the Tank consumer continues after a given position.
        later = json_lines(figtank("consume", "--tank", tank, "--json", "orders", "--from", "3"))
        assert [m["value"] for m in later] == ["c"]

        produced = figtank("produce", "--tank", tank, "--json", "orders", "d", "--key", "k1")
        assert json_lines(produced)[0]["high_water_mark"] == 4
        subscribed = json_lines(figtank("subscribe", "--figg", figg, "--json", "orders",
                                        "--from", "2", "--count", "2"))
        assert [(m["offset"], m["data"]) for m in subscribed] == [(3, "c"), (4, "d")]

        assert metric(server, 'figtank_messages_in_total{topic="orders"}') == 4
        assert metric(server, 'figtank_requests_total{protocol="tank"') > 0
        assert server.stop() == 0

    # The store is intact after the restart, and inspect reads its files directly.
    with figtank_serve("--config", str(config)) as server:
        again = json_lines(figtank("consume", "--tank", addr(server.tank), "--json", "orders"))
        assert [m["value"] for m in again] == ["a", "b", "c", "d"]
        assert server.stop() == 0
    inspected = json_lines(figtank("inspect", "--json", "--index",
                                   str(tmp_path / "data" / "orders" / "0")))
    kinds = [line["kind"] for line in inspected]
    assert kinds[0] == "segment" and "index" in kinds
    messages = [line for line in inspected if line["kind"] == "message"]
    assert [(m["seq"], m["key"], m["size"]) for m in messages] == [
        (1, None, 1), (2, None, 1), (3, None, 1), (4, "k1", 1)]


def test_fetch_over_kafka_reads_what_figg_published_at_offset_seq_minus_1(
        config: Path) -> None:
    with figtank_serve("--config", str(config), "--kafka-listen", "127.0.0.1:0") as server:
        kafka = addr(server.kafka)
        published = figtank("publish", "--figg", addr(server.figg), "orders", "a", "b", "c")
        assert published.returncode == 0, published.stderr

        fetched = json_lines(figtank("fetch", "--kafka", kafka, "--json", "orders"))
        assert [(m["offset"], m["value"]) for m in fetched] == [(0, "a"), (1, "b"), (2, "c")]
        later = json_lines(figtank("fetch", "--kafka", kafka, "--json", "orders", "--from",
                                   "1", "--count", "1"))
        assert [(m["offset"], m["value"]) for m in later] == [(1, "b")]
        # the end of the partition is no error; past it is Kafka's own
        assert json_lines(figtank("fetch", "--kafka", kafka, "--json", "orders", "--from",
                                  "3")) == []
        past = figtank("fetch", "--kafka", kafka, "orders", "--from", "9")
        assert (past.returncode, past.stderr.strip()) == (
            1, "figtank fetch: fetch of orders/0 at 9: OFFSET_OUT_OF_RANGE")
        unknown = figtank("fetch", "--kafka", kafka, "nosuch")
        assert unknown.returncode == 1
        assert "UNKNOWN_TOPIC_OR_PARTITION" in unknown.stderr
        assert "Traceback" not in unknown.stderr
        assert server.stop() == 0


def test_topics_and_status(config: Path) -> None:
    with figtank_serve("--config", str(config)) as server:
        tank = addr(server.tank)
        created = figtank("topics", "--tank", tank, "create", "events", "--partitions", "3",
                          "--config", "log.retention.secs=3600")
        assert created.returncode == 0, created.stderr
        assert "created events with 3 partitions" in created.stdout
        assert json_lines(figtank("topics", "--tank", tank, "--json", "list")) == [
            {"topic": "events", "partitions": 3}]
        described = json_lines(figtank("topics", "--tank", tank, "--json", "describe", "events"))
        assert [(d["partition"], d["high_water_mark"]) for d in described] == [
            (0, 0), (1, 0), (2, 0)]
        again = figtank("topics", "--tank", tank, "create", "events")
        assert again.returncode == 1 and "events" in again.stderr
        [status] = json_lines(figtank("status", "--tank", tank, "--json"))
        assert (status["topics"], status["partitions"]) == (1, 3)
        assert server.stop() == 0


def test_inspect_lists_bundles_across_windows_up_to_a_corrupt_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspect, "WINDOW", 40)  # a few bundles a window, some carried over
    bundle = frame_bundle(encode_bundle([Message(b"x" * 9, b"k", 1), Message(b"y", None, 2)]))
    corrupt = bytearray(bundle)
    corrupt[2] = 0xFF  # the first message's flags
    (tmp_path / "1_1700000000.log").write_bytes(bundle * 5 + corrupt + bundle)
    [segment] = inspect.list_segments(str(tmp_path))
    seen = []
    with pytest.raises(ProtocolError, match=f"bundle at offset {5 * len(bundle)}: invalid"):
        seen.extend((m.seq, m.offset, m.key, m.size)
                    for m in inspect.iter_messages(str(tmp_path), segment))
    assert seen == [(1 + 2 * i + j, i * len(bundle), b"k" if j == 0 else None, 9 if j == 0 else 1)
                    for i in range(5) for j in (0, 1)]


def test_inspect_into_a_pipe_closed_early_stops_quietly(tmp_path: Path) -> None:
    bundle = frame_bundle(encode_bundle([Message(b"v", None, i) for i in range(1000)]))
    (tmp_path / "1_1700000000.log").write_bytes(bundle * 50)  # lines past a pipe's buffer
    reader = subprocess.Popen([sys.executable, "-m", "gateway.cli", "inspect", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline().startswith(b"# 1_1700000000.log: base 1")
    reader.stdout.close()  # as `| head -1` does
    assert reader.wait(timeout=30) == 141  # 128 + SIGPIPE, as a killed Unix filter
    assert reader.stderr.read() == b""
