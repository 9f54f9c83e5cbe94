"""Streaming: JSON events from a topic, aggregated per key and minute, written to a topic.

Run against ``make run`` (Tank on 127.0.0.1:11011, Figg on 127.0.0.1:8119)::

    python examples/spark_stream_aggregate.py [--input events] [--output event-stats]

Every trigger writes the per-minute aggregates that changed (output mode ``update``) as
JSON messages to ``--output``; a Figg subscriber of that topic sees them live. The query
checkpoints in ``--checkpoint``: stop it and start it again, and it resumes where it was.

Spark's Python data source sinks take appends only, so the updates go through
``foreachBatch`` and the ``figtank`` batch writer (a micro-batch retried after a failure
is written again: at-least-once, fine for a live view).

Ctrl-C stops the query and Spark and exits with status 130; a failure (the broker is not
there, ...) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from spark_events import add_spark_log_argument, as_messages, per_key_minute, run_spark

from gateway.core.config import parse_address


def main() -> None:
    """Parse the arguments and run the streaming query until Ctrl-C (or a failure)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", type=parse_address, default="127.0.0.1:11011",
                        help="Tank HOST:PORT")
    parser.add_argument("--input", default="events")
    parser.add_argument("--output", default="event-stats")
    parser.add_argument("--checkpoint", default="checkpoints/spark-stream-aggregate")
    parser.add_argument("--trigger", default="2 seconds")
    parser.add_argument("--from-start", action="store_true",
                        help="start with the topic's first event (a new checkpoint only)")
    add_spark_log_argument(parser)
    args = parser.parse_args()
    run_spark("figtank-stream-aggregate", lambda spark: aggregate(spark, args),
              args.spark_log)


def aggregate(spark: Any, args: argparse.Namespace) -> None:
    """Start the query; return when it is stopped (Ctrl-C), raise when it fails."""
    endpoint = "{}:{}".format(*args.endpoint)
    messages = (spark.readStream.format("figtank").option("endpoint", endpoint)
                .option("topic", args.input)
                .option("startingSequence", "earliest" if args.from_start else "latest")
                .option("maxMessagesPerTrigger", 100_000).load())

    def write(stats: Any, batch_id: int) -> None:
        (as_messages(stats).write.format("figtank").option("endpoint", endpoint)
         .option("topic", args.output).mode("append").save())

    query = (per_key_minute(messages).writeStream.foreachBatch(write)
             .option("checkpointLocation", args.checkpoint).outputMode("update")
             .trigger(processingTime=args.trigger).start())
    print(f"aggregating {args.input} -> {args.output} every {args.trigger} (Ctrl-C to stop)",
          flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
