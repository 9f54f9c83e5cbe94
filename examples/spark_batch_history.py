"""Batch: the same per-key-and-minute aggregate over a topic's whole history, read from the
segment files of a data directory (``figtank-segments``; no broker involved).

Run in the directory of ``make run`` (its data directory is ``./data``)::

    python examples/spark_batch_history.py [--data-dir data] [--topic events] [--json out]

Prints the aggregates; ``--json DIR`` also writes them as JSON lines with Spark.
"""

from __future__ import annotations

import argparse

from spark_events import per_key_minute, spark_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--json", help="also write the aggregates to this directory")
    parser.add_argument("--rows", type=int, default=50, help="rows to print")
    args = parser.parse_args()

    spark = spark_session("figtank-batch-history")
    messages = (spark.read.format("figtank-segments").option("topic", args.topic)
                .load(args.data_dir))
    stats = per_key_minute(messages).orderBy("minute", "key").cache()
    stats.show(args.rows, truncate=False)
    print(f"{stats.count()} (minute, key) rows from {messages.count()} messages")
    if args.json:
        stats.write.mode("overwrite").json(args.json)
    spark.stop()


if __name__ == "__main__":
    main()
