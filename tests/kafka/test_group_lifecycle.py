"""A Kafka group's committed offsets through its life, with real confluent-kafka consumers
in the group (plain ``subscribe()``): commits survive a SIGKILL of ``figtank serve`` and a
restart (``figtank groups describe`` shows them, the group goes on from them);
``figtank groups reset`` is refused while the group has members and takes effect on the
next join; the group metrics and the committed lag scraped from ``/metrics``."""

from __future__ import annotations

import queue
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
import trio
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.test_groups_cli import figtank
from tests.kafka.test_offsets_file import _kafka_address
from tests.kafka.test_real_clients import produce
from tests.serving import figtank_serve

#: A group member's settings: short timeouts, so a test fails in seconds.
MEMBER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
          "auto.offset.reset": "earliest", "socket.timeout.ms": 5000,
          "topic.metadata.refresh.interval.ms": 1000}


def create_topic(address: str, topic: str, partitions: int, per_partition: int) -> None:
    """``topic`` with ``per_partition`` messages in each partition."""
    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)
    producer = ck.Producer({**CONFLUENT, "bootstrap.servers": address, "linger.ms": 5})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, b"%d-%d" % (p, i), partition=p)
    assert producer.flush(10) == 0


def read(consumer: Any, count: int, timeout: float = 10) -> list[tuple[int, int]]:
    """``count`` messages' ``(partition, offset)``; fewer if ``timeout`` passes first."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.consume(count - len(got), timeout=0.2):
            if not message.error():
                got.append((message.partition(), message.offset()))
    return got


def joined(address: str, group: str, topic: str, **config: Any) -> Any:
    consumer = ck.Consumer({**MEMBER, "bootstrap.servers": address, "group.id": group,
                            "enable.auto.commit": False, **config})
    consumer.subscribe([topic])
    return consumer


class LiveMember(threading.Thread):
    """A confluent-kafka consumer polling in a group until :meth:`finish` (which closes
    it: LeaveGroup). :meth:`commit` has it commit (in its own thread: a synchronous
    commit from another thread than the polling one never returns)."""

    def __init__(self, address: str, group: str, topic: str, **config: Any) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.consumer = ck.Consumer({**MEMBER, "bootstrap.servers": address,
                                     "group.id": group, **config})
        self.assigned: frozenset[int] = frozenset()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._commits: queue.Queue[tuple[list[Any], threading.Event]] = queue.Queue()

    def commit(self, partition: int, offset: int) -> None:
        """Commit ``offset`` for ``partition`` (synchronously)."""
        done = threading.Event()
        self._commits.put(([ck.TopicPartition(self.topic, partition, offset)], done))
        assert done.wait(10), "the commit was not answered"

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic])
            while not self.stop.is_set():
                self.consumer.poll(0.05)
                while not self._commits.empty():
                    offsets, done = self._commits.get()
                    self.consumer.commit(offsets=offsets, asynchronous=False)
                    done.set()
                self.assigned = frozenset(p.partition for p in self.consumer.assignment())
            self.consumer.close()
        except BaseException as exc:  # shown by the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(15)
        assert not self.is_alive(), "the member did not close"
        assert self.error is None, self.error


async def until(check: Callable[[], Any], timeout: float, what: str,
                state: Callable[[], Any] = lambda: None) -> None:
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"{what} not within {timeout} s: {state()}")


# ------------------------------------------------------------------ SIGKILL, restart

def test_group_commits_survive_sigkill_and_restart(tmp_path):
    args = ("--data-dir", str(tmp_path / "data"), "--durability", "fsync",
            "--kafka-listen", "127.0.0.1:0", "--tank-listen", "", "--figg-listen", "",
            "--metrics-listen", "")
    with figtank_serve(*args) as served:
        kafka = "{}:{}".format(*_kafka_address(served.log_lines))
        create_topic(kafka, "crash", 2, 10)
        consumer = joined(kafka, "C", "crash")
        before = read(consumer, 8)
        assert len(before) == 8, before
        committed = {tp.partition: tp.offset for tp in consumer.commit(asynchronous=False)
                     if tp.offset >= 0}
        # Killed while the group has its member, right after the commit's answer.
        served.process.send_signal(signal.SIGKILL)
        served.process.wait()
    consumer.close()
    assert committed == {p: max(o for q, o in before if q == p) + 1 for p, _ in before}
    with figtank_serve(*args) as served:
        kafka = "{}:{}".format(*_kafka_address(served.log_lines))
        described = figtank("groups", "describe", "C", "--kafka", kafka)
        assert described.returncode == 0, described.stderr
        assert described.stdout.splitlines()[1:] == [
            f"crash\t{p}\t{o}\t10\t{10 - o}\t-" for p, o in sorted(committed.items())]
        # The group goes on where it was: the other 12 messages, none again.
        consumer = joined(kafka, "C", "crash")
        try:
            after = read(consumer, 12)
            after += read(consumer, 1, timeout=0.5)  # anything more is a duplicate
        finally:
            consumer.close()
        served.stop()
    assert sorted(before + after) == [(p, o) for p in range(2) for o in range(10)]


# ------------------------------------------------------------------------- reset

def first_on_join(address: str, group: str, topic: str) -> int:
    """The offset a consumer joining ``group`` reads first (it commits nothing)."""
    consumer = joined(address, group, topic)
    try:
        got = read(consumer, 1)
    finally:
        consumer.close()
    assert got, "nothing read"
    return got[0][1]


async def test_reset_refused_with_members_then_taken_on_the_next_join(tmp_path):
    base = 1_700_000_000_000
    async with kafka_server(tmp_path) as server:
        address = bootstrap(server)
        assert server.offsets is not None
        await trio.to_thread.run_sync(lambda: produce(
            address, "r", [(None, b"r%d" % i) for i in range(10)],
            timestamps=[base + 1000 * i for i in range(10)]))

        def committed() -> int | None:
            c = server.offsets.committed("R").get(("r", 0))  # type: ignore[union-attr]
            return None if c is None else c.offset
        member = LiveMember(address, "R", "r", **{"enable.auto.commit": True,
                                                   "auto.commit.interval.ms": 100})
        member.start()
        try:
            await until(lambda: committed() == 10, 10, "the member's commit", committed)

            def reset(*how: str) -> Any:
                return figtank("groups", "reset", "R", "--topic", "r", *how, "--execute",
                               "--kafka", address)
            refused = await trio.to_thread.run_sync(reset, "--to-earliest")
            assert refused.returncode == 1
            assert refused.stderr.strip() == ("figtank groups: group 'R' has active members "
                                              "(1 member, Stable): stop its consumers first")
            assert committed() == 10
        finally:
            await trio.to_thread.run_sync(member.finish)
        for how, first in ((("--to-offset", "3"), 3), (("--to-earliest",), 0),
                           (("--to-timestamp", str(base + 5500)), 6),
                           (("--to-latest",), None)):
            done = await trio.to_thread.run_sync(reset, *how)
            assert done.returncode == 0, (how, done.stderr)
            assert committed() == (10 if first is None else first), how
            if first is not None:
                assert await trio.to_thread.run_sync(
                    first_on_join, address, "R", "r") == first, how


# ----------------------------------------------------------------------- metrics

def scrape(address: tuple[str, int]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics``: every sample's value by (name, sorted labels)."""
    url = "http://{}:{}/metrics".format(*address)
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def group_view(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]
               ) -> dict[str, Any]:
    """The group metrics, compactly."""
    view: dict[str, Any] = {"groups": {}, "rebalances": {}, "lag": {}}
    for (name, labels), value in metrics.items():
        tags = dict(labels)
        if name == "figtank_kafka_groups" and value:
            view["groups"][tags["state"]] = value
        elif name == "figtank_kafka_group_members":
            view["members"] = value
        elif name == "figtank_kafka_group_rebalances_total":
            view["rebalances"][tags["reason"]] = value
        elif name == "figtank_committed_lag_messages":
            view["lag"][(tags["group"], tags["topic"], tags["partition"])] = value
    return view


async def test_group_metrics_through_a_real_group(tmp_path):
    async with kafka_server(tmp_path, metrics_listen="127.0.0.1:0") as server:
        address = bootstrap(server)
        assert server.metrics is not None
        await trio.to_thread.run_sync(create_topic, address, "lagged", 2, 10)
        members = [LiveMember(address, "M", "lagged", **{"enable.auto.commit": False})
                   for _ in range(2)]
        view: dict[str, Any] = {}

        async def seen(check: Callable[[dict[str, Any]], bool]) -> bool:
            view.update(group_view(await trio.to_thread.run_sync(scrape, server.metrics)))
            return check(view)

        async def wait_for(check: Callable[[dict[str, Any]], bool], timeout: float,
                           what: str) -> None:
            with trio.move_on_after(timeout):
                while not await seen(check):
                    await trio.sleep(0.1)
                return
            raise AssertionError(f"{what} not within {timeout} s: {view}")
        try:
            for m in members:
                m.start()
            await until(lambda: all(len(m.assigned) == 1 for m in members), 12,
                        "one partition each", lambda: [m.assigned for m in members])
            await wait_for(lambda v: v["groups"] == {"Stable": 1} and v["members"] == 2
                           and v["rebalances"].get("join", 0) >= 1, 5, "a Stable group")
            # Each member commits for its partition: 4 of 10 and 7 of 10 messages.
            for m, offset in zip(members, (4, 7), strict=True):
                (p,) = m.assigned
                await trio.to_thread.run_sync(m.commit, p, offset)
            lag = {("M", "lagged", str(next(iter(m.assigned)))): float(10 - offset)
                   for m, offset in zip(members, (4, 7), strict=True)}
            # The high-water marks are refreshed every few seconds.
            await wait_for(lambda v: v["lag"] == lag, 8, "the committed lag")
            await trio.to_thread.run_sync(members[0].finish)
            await until(lambda: members[1].assigned == {0, 1}, 8, "the other member with both")
            await wait_for(lambda v: v["groups"] == {"Stable": 1} and v["members"] == 1
                           and v["rebalances"].get("leave") == 1, 5, "one member left")
        finally:
            for m in members:
                if m.is_alive():
                    await trio.to_thread.run_sync(m.finish)
        await wait_for(lambda v: v["groups"] == {} and v["members"] == 0
                       and v["rebalances"].get("leave") == 2 and v["lag"] == lag, 5,
                       "the group gone, its committed lag kept")
