"""The exactly-once protocol of the streaming sink, task by task, against a live server:
attempts of one task are run here as Spark would run them after a crash or a retry (a
JVM adds nothing to what is checked; tests/spark/test_stream_kill.py kills a real
driver)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pyarrow as pa
import pytest

from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark import exactly_once
from gateway.spark.exactly_once import ReplayMismatch, TaskIdentity, record_commit
from gateway.spark.ledger import Ledger, topic_name
from gateway.spark.options import tank_options
from gateway.spark.sink import write_batches
from tests.spark.helpers import BackgroundServer

Stored = tuple[int, bytes | None, bytes]


def options(server: BackgroundServer, topic: str, **more: object):
    return tank_options({"endpoint": server.endpoint, "topic": topic,
                         **{k: str(v) for k, v in more.items()}}, streaming=True)


def rows(tag: str, n: int, *, keyed: bool = True, chunk: int = 100) -> list[pa.RecordBatch]:
    """``n`` rows as Arrow batches of ``chunk``; keys k0..k9 (or none)."""
    out = []
    for lo in range(0, n, chunk):
        values = [f"{tag}-{i}".encode() for i in range(lo, min(n, lo + chunk))]
        columns = {"value": pa.array(values, pa.binary())}
        if keyed:
            columns["key"] = pa.array([f"k{i % 10}".encode() for i in range(lo, lo + len(values))],
                                      pa.binary())
        out.append(pa.RecordBatch.from_pydict(columns))
    return out


def stored(server: BackgroundServer, topic: str) -> list[Stored]:
    """(partition, key, value) of every message of ``topic``, in log order."""
    out = []
    with server.client() as client:
        for bounds in client.discover_partitions(topic):
            seq = 1
            while seq <= bounds.high_water_mark:
                result = client.consume(topic, bounds.partition, seq)
                out += [(bounds.partition, m.key, m.value) for m in result.messages
                        if m.seq >= seq]
                seq = result.next_seq
    return out


def values(found: list[Stored]) -> Counter[bytes]:
    return Counter(v for _, _, v in found)


def attempt(query: str, batch: int, task: int, name: str) -> TaskIdentity:
    return TaskIdentity(query, "run", batch, task, name)


def crash_after(batches: list[pa.RecordBatch], n: int) -> Iterator[pa.RecordBatch]:
    """The task's input, dying after ``n`` batches (the flushes before were written)."""
    for i, batch in enumerate(batches):
        if i == n:
            raise RuntimeError("the driver died")
        yield batch


def new_topic(server: BackgroundServer, partitions: int) -> str:
    topic = f"eo-{uuid.uuid4().hex[:10]}"
    with server.client() as client:
        client.create_topic(topic, partitions)
    return topic


def test_a_replayed_task_appends_nothing(server: BackgroundServer) -> None:
    topic, query = new_topic(server, 3), str(uuid.uuid4())
    opts = options(server, topic, batchMessages=64)
    first = write_batches(opts, rows("a", 500), attempt(query, 0, 0, "a1"))
    assert sum(first.counts.values()) == 500 and first.skipped == 0
    before = stored(server, topic)
    again = write_batches(opts, rows("a", 500), attempt(query, 0, 0, "a2"))
    assert again.counts == {} and again.skipped == 500
    assert stored(server, topic) == before
    assert values(before) == Counter(f"a-{i}".encode() for i in range(500))
    # keyed rows by crc32(key): each key in one partition
    assert len({(k, p) for p, k, _ in before}) == 10


def test_a_half_written_task_is_completed_once(server: BackgroundServer) -> None:
    topic, query = new_topic(server, 2), str(uuid.uuid4())
    opts = options(server, topic, batchMessages=50)
    with pytest.raises(RuntimeError, match="driver died"):
        write_batches(opts, crash_after(rows("h", 400, chunk=40), 4),
                      attempt(query, 3, 1, "h1"))
    half = stored(server, topic)
    assert 0 < len(half) < 400
    replay = write_batches(opts, rows("h", 400, chunk=40), attempt(query, 3, 1, "h2"))
    assert replay.skipped == len(half) and sum(replay.counts.values()) == 400 - len(half)
    assert values(stored(server, topic)) == Counter(f"h-{i}".encode() for i in range(400))


def test_an_intent_whose_produce_never_came_is_written_by_the_replay(
        server: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver died between the intent and its produce: the replay writes the piece."""
    topic, query = new_topic(server, 1), str(uuid.uuid4())
    opts = options(server, topic)

    def dies(self, batches, **kwargs):
        raise RuntimeError("the driver died")

    with monkeypatch.context() as patched:
        patched.setattr(BlockingTankClient, "produce_with_seqnum", dies)
        with pytest.raises(RuntimeError, match="driver died"):
            write_batches(opts, rows("i", 30), attempt(query, 0, 0, "i1"))
    assert stored(server, topic) == []
    replay = write_batches(opts, rows("i", 30), attempt(query, 0, 0, "i2"))
    assert sum(replay.counts.values()) == 30
    assert values(stored(server, topic)) == Counter(f"i-{i}".encode() for i in range(30))


def test_a_late_produce_of_a_dead_attempt_and_its_replay_land_once(
        server: BackgroundServer) -> None:
    """The first attempt stored its intent and stalls before its produce (a task of a
    dead driver); the replay writes meanwhile; then the stalled produce goes out."""
    topic, query = new_topic(server, 2), str(uuid.uuid4())
    opts = options(server, topic)
    stalled, resume = threading.Event(), threading.Event()
    real = BlockingTankClient.produce_with_seqnum

    class Stalling(BlockingTankClient):
        def produce_with_seqnum(self, batches, **kwargs):
            stalled.set()
            assert resume.wait(30)
            return real(self, batches, **kwargs)

    errors: list[BaseException] = []
    reports = []

    def zombie() -> None:
        try:
            with Stalling(opts.host, opts.port, request_timeout=30) as c:
                producer = exactly_once.OnceProducer(opts, c, attempt(query, 5, 0, "z1"))
                for batch in rows("z", 80):
                    producer.add(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                 None, None)
                reports.append(producer.finish())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=zombie)
    thread.start()
    assert stalled.wait(30)
    replay = write_batches(opts, rows("z", 80), attempt(query, 5, 0, "z2"))
    assert sum(replay.counts.values()) == 80  # the stalled attempt's produce never came
    resume.set()
    thread.join(30)
    assert not errors
    assert reports[0].counts == {} and reports[0].skipped == 80  # refused, then recognised
    assert values(stored(server, topic)) == Counter(f"z-{i}".encode() for i in range(80))


def test_parallel_attempts_of_one_task_write_once(server: BackgroundServer) -> None:
    topic, query = new_topic(server, 2), str(uuid.uuid4())
    opts = options(server, topic, batchMessages=20)
    reports, errors = [], []

    def run(name: str) -> None:
        try:
            reports.append(write_batches(opts, rows("p", 300, chunk=15),
                                         attempt(query, 1, 0, name)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"p{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sum(sum(r.counts.values()) for r in reports) == 300
    assert sum(r.skipped for r in reports) == 600
    assert values(stored(server, topic)) == Counter(f"p-{i}".encode() for i in range(300))


def test_tasks_and_queries_writing_one_topic_at_once(server: BackgroundServer) -> None:
    """Two queries, two tasks each, into the same partitions at the same time: each of
    them retries where another got first, and every row lands once."""
    topic = new_topic(server, 2)
    opts = options(server, topic, batchMessages=10)
    queries = [str(uuid.uuid4()), str(uuid.uuid4())]
    errors: list[BaseException] = []

    def run(q: int, task: int) -> None:
        try:
            write_batches(opts, rows(f"q{q}t{task}", 200, chunk=10),
                          attempt(queries[q], 0, task, f"q{q}t{task}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(q, t)) for q in (0, 1) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert values(stored(server, topic)) == Counter(
        f"q{q}t{t}-{i}".encode() for q in (0, 1) for t in (0, 1) for i in range(200))


def test_keyless_rows_go_to_one_partition_per_task_and_batch(server: BackgroundServer) -> None:
    topic, query = new_topic(server, 4), str(uuid.uuid4())
    opts = options(server, topic, batchMessages=16)
    write_batches(opts, rows("n", 100, keyed=False), attempt(query, 6, 1, "n1"))
    write_batches(opts, rows("m", 100, keyed=False), attempt(query, 6, 3, "m1"))
    found = stored(server, topic)
    assert {p for p, _, v in found if v.startswith(b"n-")} == {(6 + 1) % 4}
    assert {p for p, _, v in found if v.startswith(b"m-")} == {(6 + 3) % 4}


def test_row_order_matters_only_for_a_task_written_in_part(server: BackgroundServer) -> None:
    topic, query = new_topic(server, 1), str(uuid.uuid4())
    # One flush: the replay's rows come in another order, and are recognised as written.
    opts = options(server, topic)
    write_batches(opts, rows("o", 50), attempt(query, 0, 0, "o1"))
    reordered = [b.take(pa.array(range(b.num_rows - 1, -1, -1))) for b in rows("o", 50)][::-1]
    replay = write_batches(opts, reordered, attempt(query, 0, 0, "o2"))
    assert replay.skipped == 50 and replay.counts == {}
    # Several flushes, the first attempt died after some: another order can not be
    # completed exactly once, and says so instead of writing anything.
    small = options(server, topic, batchMessages=10)
    with pytest.raises(RuntimeError, match="driver died"):
        write_batches(small, crash_after(rows("r", 100, chunk=10), 3),
                      attempt(query, 0, 1, "r1"))
    before = stored(server, topic)
    shuffled = [b.take(pa.array(range(b.num_rows - 1, -1, -1))) for b in rows("r", 100, chunk=10)]
    with pytest.raises(ReplayMismatch, match="same rows in the same order"):
        write_batches(small, shuffled, attempt(query, 0, 1, "r2"))
    assert stored(server, topic) == before


def test_a_committed_batch_is_not_written_again(server: BackgroundServer) -> None:
    topic, query = new_topic(server, 2), str(uuid.uuid4())
    opts = options(server, topic)
    reports = [write_batches(opts, rows(f"c{t}", 40), attempt(query, 7, t, f"c{t}"))
               for t in (0, 1)]
    commit = record_commit(opts, reports, 7)
    assert commit is not None and (commit.batch, commit.written) == (7, 80)
    before = stored(server, topic)

    def untouched() -> Iterator[pa.RecordBatch]:
        raise AssertionError("a committed batch's rows are not even read")
        yield

    again = write_batches(opts, untouched(), attempt(query, 7, 0, "c-again"))
    assert again.counts == {} and again.query_id == query
    assert stored(server, topic) == before
    with server.client() as client:
        last = Ledger(client, topic_name("spark-sink", query)).last_commit()
    assert last == commit
    # The next batch is written as usual.
    write_batches(opts, rows("d", 10), attempt(query, 8, 0, "d"))
    assert len(stored(server, topic)) == 90
