"""Exactly once through a driver crash: a streaming query copies a topic a publisher keeps
appending to, its driver (a process of its own) is SIGKILLed in the middle of a
micro-batch, the query is restarted on the same checkpoint (by the tests' own Spark
session: another driver, already started), and the target holds every message once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.client.errors import UnknownTopicError
from gateway.spark.ledger import COMMITS, Commit, Ledger, decode_commit, topic_name
from protocols.tank.bundle import Message
from tests.spark.helpers import BackgroundServer
from tests.spark.jvm import spark_process_env
from tests.spark.stream_copy import BATCH, start_copy
from tests.spark.test_examples import gone

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("stream_copy.py")


class Publisher(threading.Thread):
    """Appends keyed messages to both partitions of ``topic``: ``burst`` at once, then
    ``step`` every 0.1 s until stopped or ``cap`` were sent."""

    def __init__(self, server: BackgroundServer, topic: str, *, burst: int = 800,
                 step: int = 2, cap: int = 3000) -> None:
        super().__init__(daemon=True)
        self.server, self.topic = server, topic
        self.burst, self.step, self.cap = burst, step, cap
        self.sent: list[bytes] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.server.client() as client:
                count = self.burst
                while not self.halt.is_set() and len(self.sent) < self.cap:
                    n = len(self.sent)
                    values = [f"m{n + i}".encode() for i in range(count)]
                    client.produce({(self.topic, p): [Message(v, f"k{i % 7}".encode())
                                                      for i, v in enumerate(values[p::2])]
                                    for p in (0, 1)})
                    self.sent += values
                    count = self.step
                    time.sleep(0.1)
        except BaseException as exc:
            self.error = exc


def ledger_state(server: BackgroundServer, query: str) -> tuple[Commit | None, int]:
    """The query's last commit record and its intents partition's high-water mark."""
    with server.client() as client:
        ledger = Ledger(client, topic_name("spark-sink", query))
        try:
            _, intents = ledger.ends()
        except UnknownTopicError:
            return None, 0
        return ledger.last_commit(), intents


def commits(server: BackgroundServer, query: str) -> list[Commit]:
    with server.client() as client:
        topic = topic_name("spark-sink", query)
        end = client.discover_partitions(topic, [COMMITS])[0].high_water_mark
        found, seq = [], 1
        while seq <= end:
            result = client.consume(topic, COMMITS, seq)
            found += [decode_commit(m.value) for m in result.messages if m.seq >= seq]
            seq = result.next_seq
        return found


def copied(server: BackgroundServer) -> Counter[bytes]:
    out: Counter[bytes] = Counter()
    with server.client() as client:
        for bounds in client.discover_partitions("kill-out"):
            seq = 1
            while seq <= bounds.high_water_mark:
                result = client.consume("kill-out", bounds.partition, seq)
                out.update(m.value for m in result.messages if m.seq >= seq)
                seq = result.next_seq
    return out


def copied_count(server: BackgroundServer) -> int:
    """How many messages the target holds (its partitions' high-water marks: the sink's
    produces leave no gap), without reading them as :func:`copied` does."""
    with server.client() as client:
        return sum(b.high_water_mark for b in client.discover_partitions("kill-out"))


def wait_for(predicate: Callable[[], bool], timeout: float,
             describe: Callable[[], str], every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {describe()}"
        time.sleep(every)


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it (one pass over /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += parents.get(found[-1], [])
    return found


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid``'s process group and the groups of the processes under it, at once:
    the driver (Python and its JVM) and Spark's Python workers (a group of their own,
    whose tasks would otherwise go on writing from what they had read for a moment).
    Returns the processes killed."""
    tree = process_tree(pid)
    groups = set()
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(member))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    return tree


def start_driver(server: BackgroundServer, checkpoint: str, errors: Path
                 ) -> subprocess.Popen[str]:
    """``stream_copy.py`` as a process (and session) of its own."""
    with errors.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), server.endpoint, "kill-in", "kill-out", checkpoint],
            cwd=errors.parent, env=spark_process_env(ROOT), stdout=subprocess.PIPE,
            stderr=stderr, text=True, start_new_session=True)


def kill_mid_batch(server: BackgroundServer, driver: subprocess.Popen[str], errors: Path
                   ) -> tuple[str, list[int]]:
    """Wait for the driver's query to be in the middle of a micro-batch, and kill it: its
    id and the processes killed."""
    assert driver.stdout is not None
    line = driver.stdout.readline()
    assert line.startswith("query "), errors.read_text()[-3000:]
    query_id = line.split()[1]
    seen = {"commits": -1, "intents": 0}

    def mid_batch() -> bool:
        """A batch is being written: a few produces (intents) behind it, of hundreds (its
        tasks produce 2 messages at a time), and it is not committed."""
        try:
            commits_end, intents = Ledger(poller, topic_name("spark-sink", query_id)).ends()
        except UnknownTopicError:
            return False
        if commits_end != seen["commits"]:
            seen.update(commits=commits_end, intents=intents)
        return intents >= seen["intents"] + 3

    with server.client() as poller:
        # Looked at every 5 ms: a batch is written in a fraction of a second.
        wait_for(mid_batch, 120, lambda: "a micro-batch in progress: "
                 + errors.read_text()[-3000:], every=0.005)
        killed = kill_tree(driver.pid)
    driver.wait()
    return query_id, killed


def test_sigkill_mid_batch_then_restart_copies_every_message_once(
        spark, server: BackgroundServer, tmp_path: Path) -> None:
    with server.client() as client:
        client.create_topic("kill-in", 2)
        client.create_topic("kill-out", 2)
    checkpoint = str(tmp_path / "checkpoint")
    publisher = Publisher(server, "kill-in")
    publisher.start()
    try:
        driver = start_driver(server, checkpoint, tmp_path / "driver.err")
        try:
            query_id, killed = kill_mid_batch(server, driver, tmp_path / "driver.err")
            sent_at_kill = len(publisher.sent)
        finally:
            if driver.poll() is None:
                kill_tree(driver.pid)
                driver.wait()
        assert gone(killed), "a process of the killed driver stayed"
        before, _ = ledger_state(server, query_id)
        interrupted = before.batch + 1 if before else 0
        written_then = sum(copied(server).values()) - sum(
            c.written for c in commits(server, query_id) if c.batch < interrupted)
        assert 0 < written_then < BATCH, "the kill did not land in the middle of a batch"

        query = start_copy(spark, server.endpoint, "kill-in", "kill-out", checkpoint)
        try:
            assert str(query.id) == query_id  # the checkpoint's query, resumed
            wait_for(lambda: (ledger_state(server, query_id)[0] or Commit(-1, "", 0)).batch
                     >= interrupted, 120, lambda: f"the replay of batch {interrupted}")
            publisher.halt.set()
            publisher.join(10)
            assert publisher.error is None
            assert len(publisher.sent) > sent_at_kill  # it went on appending meanwhile
            sent = Counter(b"copy-" + v for v in publisher.sent)
            wait_for(lambda: copied_count(server) >= len(sent), 120,
                     lambda: f"every message: {copied_count(server)} of {len(sent)}")
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        publisher.halt.set()
    assert copied(server) == sent  # every message, once
    # The batch the kill interrupted was replayed: what the killed driver had written of
    # it was found there, and the rest written.
    replay = next(c for c in commits(server, query_id) if c.batch == interrupted)
    assert (replay.skipped, replay.written) == (written_then, BATCH - written_then), replay
