"""PySpark data sources for figtank topics (``figtank``) and segment files (``figtank-segments``).

Install the extra (``pip install 'figtank[spark]'``: PySpark 4, PyArrow), then::

    from gateway.spark import register
    register(spark)

With a local master and neither ``PYSPARK_PYTHON`` nor ``spark.pyspark.python`` set,
``register`` also makes Spark's Python workers run this interpreter (``sys.executable``,
e.g. the virtualenv's, where figtank is installed) instead of a bare ``python3``; see
:func:`register`.

    df = (spark.read.format("figtank")
          .option("endpoint", "127.0.0.1:11011").option("topic", "orders").load())
    history = spark.read.format("figtank-segments").option("topic", "orders").load("data")

Both read rows ``topic string, partition int, sequence bigint, timestamp timestamp,
key binary, value binary`` (``key`` null when the message has none).

``figtank`` options (names are case-insensitive, values keep their case):

==========================  =====================================================
``endpoint``                Tank endpoint ``HOST:PORT`` (default 127.0.0.1:11011)
``topic``                   the topic (required)
``partitions``              ``"0,2"``: only these partitions (default all)
``startingSequence``        ``earliest`` | ``latest`` | a sequence number | JSON per
                            partition ``{"0": 17, "1": "earliest"}``; inclusive.
                            Default ``earliest`` (batch), ``latest`` (stream)
``endingSequence``          batch: ``latest`` | a number | JSON; exclusive
``maxMessagesPerSplit``     sequence numbers per Spark task (default 250000)
``maxMessagesPerTrigger``   stream: at most this many messages per micro-batch
``failOnDataLoss``          raise when wanted messages were removed by retention
                            (default true; false skips to the first available)
``fetchBytes``              Consume fetch size (default 4 MiB)
``requestTimeout``          seconds (default 60); ``clientId`` (figtank-spark)
``arrow``                   return Arrow batches (default true) or tuples
``batchMessages``           write: messages per Produce (default 4096)
``batchBytes``              write: bytes per Produce (default 1 MiB)
``compression``             write: ``auto`` (Tank's rule) | ``none`` | ``snappy``
``exactlyOnce``             streaming write: a replayed micro-batch appends nothing
                            twice (default true; false: at least once)
``commitTopicPrefix``       streaming write: the query's commit topic is this,
                            ``-``, the query id (default ``spark-sink``)
==========================  =====================================================

Streaming offsets are the next sequence number of each partition, checkpointed by
Spark: a restarted query resumes with no gap and no duplicate. ``Trigger.AvailableNow``
reads what existed when the query started (in ``maxMessagesPerTrigger`` batches).
Writing (:mod:`gateway.spark.sink`) takes ``value`` and optional ``key``,
``partition``, ``timestamp`` columns; streaming writes are exactly-once
(:mod:`gateway.spark.exactly_once`), batch writes at-least-once. ``figtank-segments``: see
:mod:`gateway.spark.segments`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from gateway.extras import require

if TYPE_CHECKING:  # the spark extra: imported by the type checker only
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Register ``figtank`` and ``figtank-segments`` with a SparkSession.

    Spark starts its Python workers with ``PYSPARK_PYTHON``, else a bare ``python3`` from
    ``PATH``, which usually lacks figtank (and often PySpark). So with a local master
    (the workers run on this machine) and neither ``PYSPARK_PYTHON`` nor
    ``spark.pyspark.python`` set, the workers of Python functions defined from now on,
    these data sources included, run ``sys.executable`` instead. A cluster's workers
    need figtank installed in the Python their ``PYSPARK_PYTHON`` names.
    """
    for module in ("pyspark", "pyarrow"):
        require(module, extra="spark", purpose="the figtank Spark data sources")
    from gateway.spark.segments import FigtankSegmentsDataSource
    from gateway.spark.source import FigtankDataSource

    _local_workers_run_this_python(spark)
    spark.dataSource.register(FigtankDataSource)
    spark.dataSource.register(FigtankSegmentsDataSource)


def _local_workers_run_this_python(spark: SparkSession) -> None:
    """Point a local SparkContext's Python workers at ``sys.executable`` unless the user
    chose a Python. PySpark reads ``PYSPARK_PYTHON`` once, into ``pythonExec``, when the
    context starts, and wraps every Python function (a data source when it is
    registered) with the value it has then: setting it here is early enough."""
    context = getattr(spark, "_sc", None)  # None with Spark Connect: the server decides
    if context is None or not context.master.startswith("local"):
        return
    if "PYSPARK_PYTHON" in os.environ or context.getConf().contains("spark.pyspark.python"):
        return
    context.pythonExec = sys.executable
