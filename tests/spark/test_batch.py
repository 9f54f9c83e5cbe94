"""Batch reads and writes through the ``figtank`` source against a live server."""

from __future__ import annotations

import datetime as dt
import sys

import pytest

from tests.spark.helpers import BackgroundServer, Produced, expected, produce, reader, rows_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_partitions(server: BackgroundServer) -> list[Produced]:
    with server.client() as client:
        client.create_topic("batch-read", 2)
    return produce(server, "batch-read", {0: 130, 1: 70})


def test_batch_read_equals_what_was_produced(spark, server: BackgroundServer,
                                             two_partitions: list[Produced]) -> None:
    df = reader(spark, server, "batch-read", maxMessagesPerSplit=50).load()
    assert df.schema.simpleString() == ("struct<topic:string,partition:int,sequence:bigint,"
                                        "timestamp:timestamp,key:binary,value:binary>")
    assert df.rdd.getNumPartitions() == 3 + 2  # 130 -> 50+50+30, 70 -> 50+20
    assert rows_of(df) == expected(two_partitions)
    assert [r.topic for r in df.select("topic").distinct().collect()] == ["batch-read"]


def test_tuples_give_the_same_rows(spark, server: BackgroundServer,
                                   two_partitions: list[Produced]) -> None:
    df = reader(spark, server, "batch-read", arrow="false").load()
    assert rows_of(df) == expected(two_partitions)


def test_partitions_and_sequence_ranges(spark, server: BackgroundServer,
                                        two_partitions: list[Produced]) -> None:
    df = reader(spark, server, "batch-read", partitions="1", startingSequence=10,
                endingSequence=20).load()
    assert rows_of(df) == expected([p for p in two_partitions
                                    if p.partition == 1 and 10 <= p.sequence < 20])
    per_partition = reader(spark, server, "batch-read",
                           STARTINGSEQUENCE='{"0": "latest", "1": 65}').load()  # any case
    assert rows_of(per_partition) == expected([p for p in two_partitions
                                               if p.partition == 1 and p.sequence >= 65])
    assert reader(spark, server, "batch-read", startingSequence="latest").load().count() == 0


def test_unknown_topic_and_partition_fail_clearly(spark, server: BackgroundServer,
                                                  two_partitions: list[Produced]) -> None:
    with pytest.raises(Exception, match="unknown topic 'no-such-topic'"):
        reader(spark, server, "no-such-topic").load().collect()
    with pytest.raises(Exception, match=r"no partition \[5\]"):
        reader(spark, server, "batch-read", partitions="0,5").load().collect()


def test_write_then_read_back(spark, server: BackgroundServer) -> None:
    with server.client() as client:
        client.create_topic("round-trip", 3)
    when = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    rows = [(f"v{i}".encode(), None if i % 3 == 0 else f"k{i % 5}".encode(),
             i % 3 if i % 4 == 0 else None, when + dt.timedelta(seconds=i))
            for i in range(300)]
    df = spark.createDataFrame(rows, "value binary, key binary, partition int, "
                                     "timestamp timestamp").repartition(2)
    (df.write.format("figtank").option("endpoint", server.endpoint).option("topic", "round-trip")
     .option("batchMessages", 64).mode("append").save())

    back = reader(spark, server, "round-trip").load()
    got = back.selectExpr("partition", "unix_millis(timestamp) AS ms", "key", "value").collect()
    assert sorted((bytes(r.value), r.key and bytes(r.key), r.ms) for r in got) == sorted(
        (v, k, int(t.timestamp() * 1000)) for v, k, _, t in rows)
    by_value = {bytes(r.value): r.partition for r in got}
    for value, _key, partition, _ in rows:
        if partition is not None:
            assert by_value[value] == partition
    keyed = {}  # one key, one partition
    for value, key, partition, _ in rows:
        if key is not None and partition is None:
            keyed.setdefault(key, set()).add(by_value[value])
    assert all(len(parts) == 1 for parts in keyed.values())
    # sequences are dense per partition: every message was appended once
    for p in range(3):
        seqs = sorted(r.sequence for r in back.where(f"partition = {p}").collect())
        assert seqs == list(range(1, len(seqs) + 1))


def test_string_values_are_written_as_utf8(spark, server: BackgroundServer) -> None:
    df = spark.createDataFrame([("héllo", "k")], "value string, key string")
    df.write.format("figtank").option("endpoint", server.endpoint).option(
        "topic", "strings").mode("append").save()
    row = reader(spark, server, "strings").load().collect()[0]
    assert (bytes(row.key), bytes(row.value)) == (b"k", "héllo".encode())


def test_a_failed_write_raises_the_brokers_error(spark, server: BackgroundServer) -> None:
    with server.client() as client:
        client.create_topic("two-parts", 2)
    df = spark.createDataFrame([(b"x", 7)], "value binary, partition int")
    with pytest.raises(Exception, match=r"refused the write: two-parts/7: unknown partition"):
        df.write.format("figtank").option("endpoint", server.endpoint).option(
            "topic", "two-parts").mode("append").save()
    with pytest.raises(Exception, match="writes need a 'value' column"):
        spark.createDataFrame([(1,)], "v int").write.format("figtank").option(
            "topic", "two-parts").mode("append").save()


def test_python_workers_run_this_interpreter(spark) -> None:
    ran = spark.sparkContext.parallelize([0, 1], 2).map(lambda _: sys.executable).collect()
    assert ran == [sys.executable, sys.executable]
