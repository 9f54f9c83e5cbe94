"""Streaming reads and writes through the ``figtank`` source against a live server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.spark.helpers import BackgroundServer, produce

pytestmark = pytest.mark.slow


class BatchSink:
    """An idempotent sink: rows by micro-batch id, so a replayed batch replaces itself."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[int, int, bytes]]] = {}

    def __call__(self, df, batch_id: int) -> None:
        self.batches[batch_id] = [(r.partition, r.sequence, bytes(r.value))
                                  for r in df.select("partition", "sequence", "value").collect()]

    def rows(self) -> list[tuple[int, int, bytes]]:
        return [row for _, rows in sorted(self.batches.items()) for row in rows]

    def non_empty(self) -> int:
        return sum(1 for rows in self.batches.values() if rows)


def stream(spark, server: BackgroundServer, topic: str, **options: object):
    reader = (spark.readStream.format("figtank").option("endpoint", server.endpoint)
              .option("topic", topic).option("startingSequence", "earliest"))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def wait_for(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_restart_from_checkpoint_has_no_gap_and_no_duplicate(
        spark, server: BackgroundServer, tmp_path: Path) -> None:
    topic = "stream-restart"
    with server.client() as client:
        client.create_topic(topic, 2)
    checkpoint = str(tmp_path / "checkpoint")
    sink = BatchSink()
    produced = produce(server, topic, {0: 40, 1: 20}, tag="a")

    def start():
        return (stream(spark, server, topic, maxMessagesPerTrigger=25).writeStream
                .foreachBatch(sink).option("checkpointLocation", checkpoint)
                .trigger(processingTime="100 milliseconds").start())

    query = start()
    try:
        wait_for(lambda: len(sink.rows()) >= 60)
        produced += produce(server, topic, {0: 15, 1: 15}, tag="b")  # appended while running
        wait_for(lambda: len(sink.rows()) >= 90)
    finally:
        query.stop()
    batches_before = sink.non_empty()
    assert batches_before >= 4  # 25 messages at most per micro-batch
    last_batch = max(sink.batches)
    seen = set(sink.rows())

    produced += produce(server, topic, {0: 30, 1: 10}, tag="c")  # while stopped
    query = start()
    try:
        produced += produce(server, topic, {1: 5}, tag="d")
        wait_for(lambda: len(sink.rows()) >= len(produced))
        query.processAllAvailable()
    finally:
        query.stop()
    assert sink.non_empty() > batches_before
    # resumed from the checkpoint: later batch ids, holding only what came after the stop
    resumed = [row for batch_id, rows in sink.batches.items() if batch_id > last_batch
               for row in rows]
    assert resumed and all(value.startswith((b"c-", b"d-")) for _, _, value in resumed)
    assert not seen & set(resumed)
    got = sink.rows()
    assert len(got) == len(set(got))  # no duplicate
    assert sorted(got) == sorted((p.partition, p.sequence, p.value) for p in produced)


def test_available_now_reads_in_limited_batches(spark, server: BackgroundServer,
                                                tmp_path: Path) -> None:
    topic = "stream-available-now"
    produced = produce(server, topic, {0: 95})
    sink = BatchSink()
    query = (stream(spark, server, topic, maxMessagesPerTrigger=30).writeStream
             .foreachBatch(sink).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(60)
    assert [len(rows) for _, rows in sorted(sink.batches.items())] == [30, 30, 30, 5]
    assert sorted(sink.rows()) == sorted((p.partition, p.sequence, p.value) for p in produced)


def test_stream_write_to_another_topic(spark, server: BackgroundServer, tmp_path: Path) -> None:
    produced = produce(server, "stream-in", {0: 40})
    query = (stream(spark, server, "stream-in")
             .selectExpr("key", "upper(cast(value AS string)) AS value")
             .writeStream.format("figtank").option("endpoint", server.endpoint)
             .option("topic", "stream-out")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(60)
    out = (spark.read.format("figtank").option("endpoint", server.endpoint)
           .option("topic", "stream-out").load().collect())
    assert sorted((bytes(r.value), r.key and bytes(r.key)) for r in out) == sorted(
        (p.value.upper(), p.key) for p in produced)


def test_a_replay_of_a_committed_batch_writes_nothing(spark, server: BackgroundServer,
                                                      tmp_path: Path) -> None:
    """Spark replays the last batch when its own commit log lacks it (the driver died
    after the sink's commit): the sink's commit record says it is written."""
    from gateway.spark.ledger import COMMITS, decode_commit, topic_name

    with server.client() as client:
        client.create_topic("replay-in", 2)
    produce(server, "replay-in", {0: 30, 1: 30})
    checkpoint = tmp_path / "cp"

    def run() -> str:
        query = (stream(spark, server, "replay-in")
                 .selectExpr("key", "value").writeStream.format("figtank")
                 .option("endpoint", server.endpoint).option("topic", "replay-out")
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(60)
        return str(query.id)

    query_id = run()
    for name in ("0", ".0.crc"):  # as if the driver died before writing them
        (checkpoint / "commits" / name).unlink()
    assert run() == query_id
    with server.client() as client:
        assert sum(b.high_water_mark for b in client.discover_partitions("replay-out")) == 60
        topic = topic_name("spark-sink", query_id)
        records = client.consume(topic, COMMITS, 1).messages
    assert [(c.batch, c.written) for c in map(decode_commit, (m.value for m in records))] \
        == [(0, 60), (0, 0)]  # batch 0 committed, then replayed: nothing written again
