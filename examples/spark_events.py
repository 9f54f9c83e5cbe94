"""Shared by the Spark examples: the JSON events, their per-key-and-minute aggregate, and a
Figg publisher and subscriber to feed and watch the pipeline.

Events are JSON objects published by Figg clients: ``{"key": "sensor-3", "amount": 1.5}``.
The event time is when the gateway appended the message (the Tank timestamp).

::

    python examples/spark_events.py publish [--topic events] [--rate 20]   # Figg publisher
    python examples/spark_events.py subscribe [--topic event-stats]        # prints results
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EVENT_SCHEMA = "key string, amount double"


def spark_session(app: str) -> Any:
    """A local Spark session (2 cores) with the figtank sources registered."""
    import os

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from gateway.spark import register

    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def per_key_minute(messages: Any) -> Any:
    """Rows of the figtank sources -> ``minute, key, events, total`` per key and minute.

    Messages that are not event JSON are dropped. Streaming callers add a watermark on
    ``timestamp`` first.
    """
    from pyspark.sql import functions as F

    events = (messages
              .select("timestamp", F.from_json(F.col("value").cast("string"),
                                               EVENT_SCHEMA).alias("event"))
              .where("event.key IS NOT NULL")
              .select("timestamp", "event.key", F.coalesce("event.amount", F.lit(0.0))
                      .alias("amount")))
    if messages.isStreaming:
        events = events.withWatermark("timestamp", "1 minute")
    return (events.groupBy(F.window("timestamp", "1 minute").alias("window"), "key")
            .agg(F.count("*").alias("events"), F.round(F.sum("amount"), 3).alias("total"))
            .select(F.col("window.start").alias("minute"), "key", "events", "total"))


def as_messages(stats: Any) -> Any:
    """Aggregate rows -> ``partition, key, value`` for the figtank sink: JSON values in
    partition 0, the partition a Figg subscriber of the topic reads."""
    from pyspark.sql import functions as F

    return stats.select(
        F.lit(0).alias("partition"), F.col("key"),
        F.to_json(F.struct(F.date_format("minute", "yyyy-MM-dd'T'HH:mm'Z'").alias("minute"),
                           "key", "events", "total")).alias("value"))


# ------------------------------------------------------------------ Figg clients


def publish(host: str, port: int, topic: str, rate: float, keys: int, count: int) -> None:
    from gateway.client.figg_blocking import BlockingFiggClient

    with BlockingFiggClient(host, port) as client:
        sent = 0
        while count <= 0 or sent < count:
            event = {"key": f"sensor-{random.randrange(keys)}",
                     "amount": round(random.uniform(0, 10), 2)}
            client.publish(topic, json.dumps(event).encode())
            sent += 1
            if sent % 100 == 0:
                print(f"published {sent} events to {topic}", flush=True)
            time.sleep(1 / rate)
        client.wait_all_acked()


def subscribe(host: str, port: int, topic: str, from_start: bool) -> None:
    from gateway.client.figg_blocking import BlockingFiggClient

    with BlockingFiggClient(host, port) as client:
        subscription = client.subscribe(topic, from_offset=0 if from_start else None)
        print(f"waiting for {topic} (Ctrl-C to stop)", flush=True)
        for message in subscription:
            print(message.data.decode(errors="replace"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Figg publisher/subscriber of JSON events")
    parser.add_argument("--figg", default="127.0.0.1:8119", help="Figg listener HOST:PORT")
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="publish random JSON events")
    pub.add_argument("--topic", default="events")
    pub.add_argument("--rate", type=float, default=20, help="events per second")
    pub.add_argument("--keys", type=int, default=5)
    pub.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    sub = commands.add_parser("subscribe", help="print every message of a topic")
    sub.add_argument("--topic", default="event-stats")
    sub.add_argument("--from-start", action="store_true")
    args = parser.parse_args()
    host, _, port = args.figg.rpartition(":")
    try:
        if args.command == "publish":
            publish(host, int(port), args.topic, args.rate, args.keys, args.count)
        else:
            subscribe(host, int(port), args.topic, args.from_start)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
