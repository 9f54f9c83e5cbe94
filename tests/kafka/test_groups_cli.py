"""``figtank groups`` against a ``figtank serve`` subprocess, and a Kafka group's position
handed to a Figg subscriber and a Tank consumer (commands and Python clients) with no gap
and no duplicate."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import confluent_kafka as ck
import pytest
import trio

from gateway.client.figg import open_figg_client
from gateway.client.kafka_admin import group_position
from gateway.client.tank import open_tank_client
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.test_offsets_file import _kafka_address
from tests.kafka.test_real_clients import produce
from tests.serving import figtank_serve

pytestmark = pytest.mark.slow


def figtank(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True,
                          text=True, timeout=30)


def consume_and_commit(addr: str, topic: str, group: str, count: int) -> list[bytes]:
    """A Kafka consumer of ``group`` reads ``count`` messages of partition 0 from the start
    and commits its position."""
    consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": group,
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, 0)])
    got: list[Any] = []
    while len(got) < count:
        got += consumer.consume(count - len(got), timeout=1)
    consumer.commit(asynchronous=False)
    consumer.close()
    return [m.value() for m in got]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    data = tmp_path_factory.mktemp("groups") / "data"
    with figtank_serve("--data-dir", str(data), "--durability", "os", "--kafka-listen",
                       "127.0.0.1:0", "--tank-listen", "127.0.0.1:0", "--figg-listen",
                       "127.0.0.1:0", "--metrics-listen", "") as server:
        kafka = "{}:{}".format(*_kafka_address(server.log_lines))
        produce(kafka, "h", [(None, b"m%d" % i) for i in range(10)])
        assert consume_and_commit(kafka, "h", "G", 6) == [b"m%d" % i for i in range(6)]
        yield server, kafka
        server.stop()


def test_describe_shows_committed_log_end_and_lag(served):
    _, kafka = served
    done = figtank("groups", "describe", "G", "--kafka", kafka)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tMEMBER",
                                        "h\t0\t6\t10\t4\t-"]
    as_json = figtank("groups", "describe", "G", "--kafka", kafka, "--json")
    assert json.loads(as_json.stdout) == {"group": "G", "topic": "h", "partition": 0,
                                          "committed": 6, "log_end": 10, "lag": 4,
                                          "member": None}


def test_a_group_position_goes_on_in_figg_and_tank_commands(served):
    server, kafka = served
    tank = "{}:{}".format(*server.tank)
    figg = "{}:{}".format(*server.figg)
    consumed = figtank("consume", "h", "--tank", tank, "--from-group", "G",
                       "--kafka-endpoint", kafka)
    assert consumed.returncode == 0, consumed.stderr
    assert [line.split("\t")[::3] for line in consumed.stdout.splitlines()] == [
        [str(seq), f"m{seq - 1}"] for seq in range(7, 11)]
    subscribed = figtank("subscribe", "h", "--figg", figg, "--from-group", "G",
                         "--kafka-endpoint", kafka, "--count", "4", "--idle", "5")
    assert subscribed.returncode == 0, subscribed.stderr
    assert subscribed.stdout.splitlines() == [f"{seq}\tm{seq - 1}" for seq in range(7, 11)]
    none = figtank("consume", "h", "--tank", tank, "--from-group", "nobody",
                   "--kafka-endpoint", kafka)
    assert none.returncode == 1
    assert none.stderr.strip() == ("figtank consume: group 'nobody' has no committed offset "
                                   "for h/0")


def test_reset_dry_run_then_execute(served):
    _, kafka = served
    dry = figtank("groups", "reset", "R", "--topic", "h", "--to-offset", "3", "--kafka", kafka)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[1:] == ["h\t0\t-\t3"]
    assert "dry run" in dry.stderr
    assert figtank("groups", "describe", "R", "--kafka", kafka).returncode == 1  # unchanged
    done = figtank("groups", "reset", "R", "--topic", "h/0", "--to-offset", "3", "--kafka",
                   kafka, "--execute")
    assert done.returncode == 0, done.stderr
    described = figtank("groups", "describe", "R", "--kafka", kafka)
    assert described.stdout.splitlines()[1] == "h\t0\t3\t10\t7\t-"
    for flag, expected in (("--to-latest", "10"), ("--to-earliest", "0"),
                           ("--to-timestamp", "0")):
        figtank("groups", "reset", "R", "--topic", "h", flag, *(
            ["0"] if flag == "--to-timestamp" else []), "--kafka", kafka, "--execute")
        shown = figtank("groups", "describe", "R", "--kafka", kafka).stdout
        assert shown.splitlines()[1].split("\t")[2] == expected, flag
    clamped = figtank("groups", "reset", "R", "--topic", "h", "--to-offset", "99", "--kafka",
                      kafka, "--execute")
    assert clamped.stdout.splitlines()[1] == "h\t0\t0\t10"
    assert "outside 0..10" in clamped.stderr


def test_ordinary_mistakes_are_one_line(served):
    _, kafka = served
    cases = {
        ("groups", "describe", "nope", "--kafka", kafka):
            (1, "figtank groups: unknown group 'nope' (no committed offsets, no members)"),
        ("groups", "reset", "G", "--topic", "missing", "--to-latest", "--kafka", kafka):
            (1, "figtank groups: unknown topic 'missing'"),
        ("groups", "reset", "G", "--topic", "h/3", "--to-latest", "--kafka", kafka):
            (1, "figtank groups: h has 1 partition, no partition 3"),
        ("groups", "describe", "G", "--kafka", "127.0.0.1:1", "--timeout", "2"):
            (1, None),
        ("groups", "reset", "G", "--topic", "h", "--to-offset", "-4"): (2, None),
    }
    listed = figtank("groups", "list", "--kafka", kafka)
    assert listed.returncode == 0 and "G" in listed.stdout.split()  # known by its offsets
    for args, (status, line) in cases.items():
        done = figtank(*args)
        assert done.returncode == status, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        if line is not None:
            assert done.stderr.strip() == line


async def test_python_clients_start_from_a_group_position(tmp_path):
    async with kafka_server(tmp_path) as server:
        addr = bootstrap(server)
        assert server.kafka is not None and server.tank and server.figg
        await trio.to_thread.run_sync(
            produce, addr, "p", [(None, b"v%d" % i) for i in range(8)])
        kafka_read = await trio.to_thread.run_sync(consume_and_commit, addr, "p", "K", 5)
        position = await group_position(*server.kafka, "K", "p", 0)
        assert position == 5
        async with open_tank_client(*server.tank) as tank:
            result = await tank.consume("p", 0, position + 1)
        async with open_figg_client(*server.figg) as figg:
            subscription = await figg.subscribe("p", from_offset=position)
            figg_read = [await subscription.receive() for _ in range(3)]
        assert await group_position(*server.kafka, "none", "p", 0) is None
    tank_read = [m.value for m in result.messages]
    assert kafka_read + tank_read == [b"v%d" % i for i in range(8)]
    assert [m.data for m in figg_read] == tank_read
