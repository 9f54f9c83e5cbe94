"""Consumer groups with the real clients: confluent-kafka (librdkafka) and kafka-python
consumers subscribe to a six-partition topic and split it; a member closing (LeaveGroup)
or killed with SIGKILL hands its partitions to the survivors. Plain ``subscribe()``: where
each member starts is the group's committed offset (OffsetFetch), else the earliest.
(test_group_delivery.py counts the messages across such a hand-over.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
import trio
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.helpers import bootstrap, kafka_server

TOPIC = "six"
#: librdkafka's timeouts, short: a test fails in seconds.
GROUP = {"socket.timeout.ms": 5000, "session.timeout.ms": 6000,
         "heartbeat.interval.ms": 300, "enable.auto.commit": False,
         "auto.offset.reset": "earliest"}


def create_topic(addr: str) -> None:
    admin = AdminClient({"bootstrap.servers": addr})
    for future in admin.create_topics([NewTopic(TOPIC, 6, 1)]).values():
        future.result(10)


class ConfluentMember(threading.Thread):
    """A confluent-kafka consumer in a group, polling until stopped; ``assigned`` is its
    current assignment."""

    def __init__(self, addr: str, group: str, **config: Any) -> None:
        super().__init__(daemon=True)
        self.config = {**GROUP, "bootstrap.servers": addr, "group.id": group, **config}
        self.assigned: frozenset[int] = frozenset()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            consumer = ck.Consumer(self.config)
            consumer.subscribe([TOPIC])
            while not self.stop.is_set():
                consumer.poll(0.05)
                self.assigned = frozenset(p.partition for p in consumer.assignment())
            consumer.close()  # LeaveGroup
        except BaseException as exc:  # shown by the test
            self.error = exc


class KafkaPythonMember(threading.Thread):
    """The same with kafka-python's KafkaConsumer."""

    def __init__(self, addr: str, group: str) -> None:
        super().__init__(daemon=True)
        self.addr, self.group = addr, group
        self.assigned: frozenset[int] = frozenset()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        import kafka

        try:
            consumer = kafka.KafkaConsumer(
                bootstrap_servers=self.addr, group_id=self.group, enable_auto_commit=False,
                session_timeout_ms=6000, heartbeat_interval_ms=300,
                auto_offset_reset="earliest", request_timeout_ms=10000)
            consumer.subscribe([TOPIC])
            while not self.stop.is_set():
                consumer.poll(timeout_ms=50)
                self.assigned = frozenset(p.partition for p in consumer.assignment())
            consumer.close()
        except BaseException as exc:
            self.error = exc


async def until(check: Callable[[], bool], timeout: float, what: str,
                state: Callable[[], Any]) -> None:
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"{what} not within {timeout} s: {state()}")


def split(members: list[Any], each: int) -> bool:
    """Every member holds ``each`` partitions, disjoint, together all six."""
    sets = [m.assigned for m in members]
    return all(len(s) == each for s in sets) and frozenset().union(*sets) == set(range(6))


async def _three_then_leave(tmp_path: Any, make: Callable[[str], Any]) -> None:
    async with kafka_server(tmp_path) as server:
        addr = bootstrap(server)
        await trio.to_thread.run_sync(create_topic, addr)
        members = [make(addr) for _ in range(3)]
        try:
            for m in members:
                m.start()

            def state() -> Any:
                return [(sorted(m.assigned), m.error) for m in members]
            await until(lambda: split(members, 2), 12, "three members with 2 each", state)
            members[0].stop.set()
            await trio.to_thread.run_sync(members[0].join, 10)
            assert members[0].error is None
            survivors = members[1:]
            await until(lambda: split(survivors, 3), 8, "two survivors with 3 each", state)
        finally:
            for m in members:
                m.stop.set()
            for m in members:
                await trio.to_thread.run_sync(m.join, 10)
        assert [m.error for m in members] == [None] * 3
        assert server.metrics_registry.kafka_group_rebalances.labels("leave")._value.get() >= 1


async def test_confluent_three_members_split_six_partitions_and_leave(tmp_path):
    await _three_then_leave(tmp_path, lambda addr: ConfluentMember(addr, "g-range"))


async def test_confluent_roundrobin(tmp_path):
    await _three_then_leave(tmp_path, lambda addr: ConfluentMember(
        addr, "g-rr", **{"partition.assignment.strategy": "roundrobin"}))


async def test_confluent_cooperative_sticky(tmp_path):
    await _three_then_leave(tmp_path, lambda addr: ConfluentMember(
        addr, "g-coop", **{"partition.assignment.strategy": "cooperative-sticky"}))


async def test_kafka_python_three_members_split_and_leave(tmp_path):
    await _three_then_leave(tmp_path, lambda addr: KafkaPythonMember(addr, "g-kp"))


CHILD = textwrap.dedent("""
    import sys, confluent_kafka as ck
    addr, topic, group = sys.argv[1:4]
    c = ck.Consumer({"bootstrap.servers": addr, "group.id": group,
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    while True:
        c.poll(0.05)
""")


async def test_member_killed_with_sigkill_is_replaced_within_session_timeout(tmp_path):
    async with kafka_server(tmp_path) as server:
        addr = bootstrap(server)
        await trio.to_thread.run_sync(create_topic, addr)
        members = [ConfluentMember(addr, "g-kill") for _ in range(2)]
        child = subprocess.Popen([sys.executable, "-c", CHILD, addr, TOPIC, "g-kill"],
                                 stdout=subprocess.DEVNULL,
                                 env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            for m in members:
                m.start()

            def state() -> Any:
                return [sorted(m.assigned) for m in members]
            await until(lambda: all(len(m.assigned) == 2 for m in members)
                        and not members[0].assigned & members[1].assigned, 12,
                        "two threads with 2 each (the child the third 2)", state)
            child.send_signal(signal.SIGKILL)
            child.wait(5)
            killed = time.monotonic()
            await until(lambda: split(members, 3), 10, "survivors with 3 each", state)
            took = time.monotonic() - killed
        finally:
            child.kill()
            for m in members:
                m.stop.set()
            for m in members:
                await trio.to_thread.run_sync(m.join, 10)
        assert took < 6 + 3, took  # the session timeout, and the rejoin
        assert server.metrics_registry.kafka_group_rebalances.labels(
            "session_timeout")._value.get() == 1
