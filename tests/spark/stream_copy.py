"""The streaming query of tests/spark/test_stream_kill.py: it copies a topic to another
through ``writeStream.format("figtank")``. Run as a script it is a Spark driver of its
own, which the test SIGKILLs:

    python stream_copy.py ENDPOINT SOURCE TARGET CHECKPOINT

prints ``query <id>`` once the query runs, and runs until killed (or the query fails).
"""

from __future__ import annotations

import sys
from typing import Any

#: Each micro-batch copies at most this many messages, produced this many at a time
#: by each task: dozens of produces a batch, so that a kill lands in the middle of one.
BATCH = 400
PRODUCE = 2


def start_copy(spark: Any, endpoint: str, source: str, target: str, checkpoint: str) -> Any:
    """Start the query on ``spark`` (figtank registered): ``copy-<value>`` with its key."""
    return (spark.readStream.format("figtank").option("endpoint", endpoint)
            .option("topic", source).option("startingSequence", "earliest")
            .option("maxMessagesPerTrigger", BATCH).load()
            .selectExpr("key", "concat('copy-', CAST(value AS STRING)) AS value")
            .writeStream.format("figtank").option("endpoint", endpoint)
            .option("topic", target).option("batchMessages", PRODUCE)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="50 milliseconds").start())


def main(endpoint: str, source: str, target: str, checkpoint: str) -> None:
    from pyspark.sql import SparkSession

    from gateway.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("figtank-stream-copy")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.pollingDelay", "10ms")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = start_copy(spark, endpoint, source, target, checkpoint)
    print("query", query.id, flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:])
