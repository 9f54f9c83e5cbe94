"""Spark batch-read throughput of the ``figtank`` and ``figtank-segments`` sources.

Run: ``python -m gateway.bench.micro.spark [--messages 1000000] [--size 100]
[--partitions 1] [--repeat 3] [--master local[2]]`` (needs the spark extra and Java).

A ``figtank serve`` child process (durability ``os``) on a temporary data directory gets
``--messages`` messages of ``--size`` bytes (bundles of 1000, Snappy by Tank's rule).
Then a local Spark session reads all of them into Spark's ``noop`` sink (every row
materialised, nothing written) four ways: through the broker and from the segment files,
each as Arrow batches and as tuples. Printed: rows/s and MB/s of values, best of
``--repeat`` after a warm-up read (Python workers started). Finally the same rows are
cached in Spark and written to a new topic (rows/s of the ``figtank`` sink).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from gateway.bench.serving import serve_figtank
from gateway.client.tank import open_tank_client
from protocols.tank.bundle import Message

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TOPIC = "bench"
MB = 1_000_000


async def fill(endpoint: str, messages: int, size: int, partitions: int) -> None:
    """``messages`` distinct messages of ``size`` bytes, 8 Produce requests in flight."""
    host, _, port = endpoint.rpartition(":")
    now = time.time_ns() // 1_000_000
    body = os.urandom(size // 2).hex().encode()[:size]
    async with open_tank_client(host, int(port)) as client:
        await client.create_topic(TOPIC, partitions)
        slots = trio.Semaphore(8)

        async def one(start: int) -> None:
            try:
                batch = [Message(b"%010d" % i + body[10:], b"k%d" % (i % 100), now)
                         for i in range(start, min(messages, start + 1000))]
                await client.produce({(TOPIC, (start // 1000) % partitions): batch})
            finally:
                slots.release()

        async with trio.open_nursery() as nursery:
            for start in range(0, messages, 1000):
                await slots.acquire()
                nursery.start_soon(one, start)


def spark_session(master: str) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from gateway.spark import register

    spark = (SparkSession.builder.master(master).appName("bench-spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def timed(df: DataFrame, repeat: int) -> float:
    """Best seconds to materialise every row of ``df`` (the ``noop`` sink)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-spark-") as data_dir, \
            serve_figtank(durability="os", data_dir=Path(data_dir)) as served:
        endpoint = served.tank
        start = time.perf_counter()
        trio.run(fill, endpoint, args.messages, args.size, args.partitions)
        print(f"produced {args.messages:,} x {args.size} B to {args.partitions} partition(s) "
              f"in {time.perf_counter() - start:.1f} s")
        spark = spark_session(args.master)
        broker = spark.read.format("figtank").option("endpoint", endpoint).option("topic", TOPIC)
        segments = spark.read.format("figtank-segments").option("topic", TOPIC)
        assert broker.load().count() == args.messages == segments.load(data_dir).count()
        makers: tuple[tuple[str, Callable[[str], DataFrame]], ...] = (
            ("broker", lambda a: broker.option("arrow", a).load()),
            ("segments", lambda a: segments.option("arrow", a).load(data_dir)))
        for name, make in makers:
            for arrow in ("true", "false"):
                df = make(arrow)
                seconds = timed(df, args.repeat)
                rate = args.messages / seconds
                print(f"read {name:8} {'arrow ' if arrow == 'true' else 'tuples'}: "
                      f"{rate:>11,.0f} rows/s  {rate * args.size / MB:6.1f} MB/s  "
                      f"({seconds:.2f} s, {df.rdd.getNumPartitions()} tasks)")
        source = segments.load(data_dir).select("key", "value").cache()
        source.count()
        best = float("inf")
        for i in range(args.repeat + 1):  # the first starts the writer's Python workers
            start = time.perf_counter()
            (source.write.format("figtank").option("endpoint", endpoint)
             .option("topic", f"bench-copy-{i}").mode("append").save())
            if i:
                best = min(best, time.perf_counter() - start)
        rate = args.messages / best
        print(f"write    figtank sink : {rate:>11,.0f} rows/s  {rate * args.size / MB:6.1f} MB/s  "
              f"({best:.2f} s, rows cached in Spark)")
        spark.stop()


if __name__ == "__main__":
    main()
