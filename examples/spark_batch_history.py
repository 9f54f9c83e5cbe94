"""Batch: the same per-key-and-minute aggregate over a topic's whole history, read from the
segment files of a data directory (``figtank-segments``; no broker involved).

Run in the directory of ``make run`` (its data directory is ``./data``)::

    python examples/spark_batch_history.py [--data-dir data] [--topic events] [--json out]

Prints the aggregates; ``--json DIR`` also writes them as JSON lines with Spark. Ctrl-C
cancels the jobs, stops Spark and exits with status 130; a failure (no such directory,
...) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from run_example import fail
from spark_events import add_spark_log_argument, per_key_minute, run_spark

from gateway.spark.segments import topic_names


def main() -> None:
    """Parse the arguments and run the batch job."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--json", help="also write the aggregates to this directory")
    parser.add_argument("--rows", type=int, default=50, help="rows to print")
    add_spark_log_argument(parser)
    args = parser.parse_args()
    try:  # a missing directory or topic is told in a second, before Spark starts
        topic_names(args.data_dir, args.topic)
    except OSError as exc:
        fail(str(exc))
        sys.exit(1)
    run_spark("figtank-batch-history", lambda spark: history(spark, args),
              args.spark_log)


def history(spark: Any, args: argparse.Namespace) -> None:
    """Aggregate the topic's history; print the rows (and write them with ``--json``)."""
    messages = (spark.read.format("figtank-segments").option("topic", args.topic)
                .load(args.data_dir))
    stats = per_key_minute(messages).orderBy("minute", "key").cache()
    stats.show(args.rows, truncate=False)
    print(f"{stats.count()} (minute, key) rows from {messages.count()} messages")
    if args.json:
        stats.write.mode("overwrite").json(args.json)


if __name__ == "__main__":
    main()
