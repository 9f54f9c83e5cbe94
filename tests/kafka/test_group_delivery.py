"""Issue 18's first "must show", end to end with the real clients: three members of one
group (each its own process, plain ``subscribe()``) split a six-partition topic of known
messages; one leaves (SIGTERM: it commits and closes), one is killed (SIGKILL); the group
rebalances within the session timeout and the survivor goes on from the last committed
offsets. Every message is consumed at least once (losses counted: none); duplicates are
only messages the killed member consumed after its last commit (counted, printed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
import pytest
import trio
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server

TOPIC = "six"
PARTITIONS = 6
#: Messages per partition.
PER_PARTITION = 250
#: The members' session timeout (the server's minimum is lowered to allow it).
SESSION_MS = 2000
#: Seconds each member spends on a message: it is mid-stream when stopped or killed.
DELAY = 0.004


def create_topic(address: str) -> None:
    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(10)


def produce_known(address: str) -> set[tuple[int, int]]:
    """``PER_PARTITION`` messages in each partition; their ``(partition, offset)``."""
    producer = ck.Producer({**CONFLUENT, "bootstrap.servers": address, "linger.ms": 5})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(TOPIC, b"p%d-%d" % (p, i), partition=p)
    assert producer.flush(10) == 0
    return {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}


class Member:
    """A ``tests.kafka.group_member`` process and what it said so far."""

    def __init__(self, name: str, client: str, address: str, group: str, mode: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.kafka.group_member", client, address, TOPIC, group,
             mode, str(SESSION_MS), str(DELAY)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        self.assigned: frozenset[int] = frozenset()
        self.consumed: list[tuple[int, int]] = []
        self.commits: list[tuple[int, int]] = []
        self.closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "assigned":
                self.assigned = frozenset(int(p) for p in rest.split(",") if p)
            elif kind == "m":
                p, o = rest.split()
                self.consumed.append((int(p), int(o)))
            elif kind == "commit":
                p, o = rest.split()
                self.commits.append((int(p), int(o)))
            elif kind == "closed":
                self.closed = True

    def finish(self, timeout: float = 10) -> None:
        """Wait for the process to end, and for its last lines."""
        self.process.wait(timeout)
        self._reader.join(5)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __repr__(self) -> str:
        return f"{self.name}(assigned={sorted(self.assigned)}, consumed={len(self.consumed)})"


async def until(check: Callable[[], bool], timeout: float, what: str,
                state: Callable[[], Any]) -> None:
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"{what} not within {timeout} s: {state()}")


def split(members: list[Member]) -> bool:
    """The members' assignments are disjoint, equal in size, together every partition."""
    sets = [m.assigned for m in members]
    each = PARTITIONS // len(members)
    return all(len(s) == each for s in sets) and frozenset().union(*sets) == set(
        range(PARTITIONS))


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
async def test_survivors_take_over_from_the_last_commits(tmp_path, client):
    group = f"delivery-{client}"
    async with kafka_server(tmp_path, group_min_session_timeout_ms=1000) as server:
        address = bootstrap(server)
        await trio.to_thread.run_sync(create_topic, address)
        # leaver: auto commit, stopped (commits, leaves); killed: explicit commits every
        # few messages, SIGKILLed; survivor: auto commit, reads to the end.
        members = [Member(name, client, address, group, mode) for name, mode in
                   (("leaver", "auto"), ("killed", "explicit"), ("survivor", "auto"))]
        leaver, killed, survivor = members
        try:
            def state() -> Any:
                return members
            await until(lambda: split(members), 12, "three members with 2 partitions each",
                        state)
            expected = await trio.to_thread.run_sync(produce_known, address)

            await until(lambda: len(leaver.consumed) >= 15, 5, "the leaver consuming", state)
            leaver.process.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(leaver.finish)
            assert leaver.closed, "the leaver did not close"
            await until(lambda: split([killed, survivor]), 8,
                        "two members with 3 partitions each", state)

            before = len(killed.consumed)
            await until(lambda: len(killed.consumed) >= before + 15, 5,
                        "the killed member consuming", state)
            killed.process.send_signal(signal.SIGKILL)
            await trio.to_thread.run_sync(killed.finish)
            killed_at = time.monotonic()
            # Its last commits, as the server holds them (no member may commit for its
            # partitions before the rebalance, a session timeout away).
            await trio.sleep(0.2)
            at_kill = {p: c.offset for (t, p), c in
                       server.offsets.committed(group).items() if t == TOPIC}
            survivor.process.send_signal(signal.SIGUSR1)  # on at full speed
            await until(lambda: survivor.assigned == set(range(PARTITIONS)),
                        SESSION_MS / 1000 + 4, "the survivor with every partition", state)
            took = time.monotonic() - killed_at
            seen: Callable[[], set[tuple[int, int]]] = lambda: {  # noqa: E731
                m for member in members for m in member.consumed}
            await until(lambda: seen() >= expected, 10, "every message consumed",
                        lambda: (len(seen()), len(expected)))
            survivor.process.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(survivor.finish)
        finally:
            for m in members:
                m.kill()

    counts = Counter(m for member in members for m in member.consumed)
    lost = expected - set(counts)
    duplicates = {m: n - 1 for m, n in counts.items() if n > 1}
    # What the killed member consumed of its partitions past its last commit.
    uncommitted = {(p, o) for p, o in killed.consumed
                   if p in killed.assigned and o >= at_kill.get(p, 0)}
    report = (f"{client}: {len(expected)} messages, {sum(counts.values())} consumed, "
              f"lost {len(lost)}, duplicates {sum(duplicates.values())} (the killed "
              f"member consumed {len(uncommitted)} after its last commit); rebalance "
              f"{took:.1f} s after the kill (session timeout {SESSION_MS / 1000:g} s)")
    print(report)
    assert not lost, (report, sorted(lost)[:20])
    assert sum(duplicates.values()) <= len(uncommitted), report
    assert set(duplicates) <= uncommitted, (report, sorted(set(duplicates) - uncommitted))
    assert took < SESSION_MS / 1000 + 3, report
    rebalances = server.metrics_registry.kafka_group_rebalances
    assert rebalances.labels("leave")._value.get() >= 1
    assert rebalances.labels("session_timeout")._value.get() == 1
