"""Shared by the Spark examples: the JSON events, their per-key-and-minute aggregate, how a
Spark example runs and stops (:func:`run_spark`), and a Figg publisher and subscriber to
feed and watch the pipeline.

Events are JSON objects published by Figg clients: ``{"key": "sensor-3", "amount": 1.5}``.
The event time is when the gateway appended the message (the Tank timestamp).

::

    python examples/spark_events.py publish [--topic events] [--rate 20]   # Figg publisher
    python examples/spark_events.py subscribe [--topic event-stats]        # prints results
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from run_example import (  # noqa: E402
    EXPECTED,
    FIGG_OPTIONS,
    fail,
    run_example,
    wait_figg_connected,
)

from gateway.core.config import parse_address  # noqa: E402
from gateway.core.logs import configure_logging  # noqa: E402

EVENT_SCHEMA = "key string, amount double"
LOG4J_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")
SPARK_LOG_LEVELS = ("off", "error", "warn")


def spark_session(app: str, log: str = "off") -> Any:
    """A local Spark session (2 cores) with the figtank sources registered (which also
    makes Spark's Python workers run this interpreter: see ``gateway.spark.register``).

    The JVM runs in a session of its own, so that a Ctrl-C in the terminal reaches this
    process only, not the JVM's Python workers in the middle of a task (see
    :class:`SparkInterrupt`). Spark's log goes to stderr from level ``log``
    (``log4j2.properties`` here); with ``off``, the default, the JVM's stderr (and its
    workers') is dropped, so that what an example says is all there is: failures reach
    the driver as exceptions, and ``--spark-log warn`` shows the details."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    from gateway.spark import register

    conf = (SparkConf().setMaster("local[2]").setAppName(app)
            .set("spark.driver.extraJavaOptions",
                 f"-Dlog4j2.configurationFile={LOG4J_CONFIG} "
                 f"-Dfigtank.examples.sparkLog={log}")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.sql.shuffle.partitions", "2")
            .set("spark.sql.session.timeZone", "UTC"))
    launch: dict[str, Any] = {"start_new_session": True}
    if log == "off":
        launch["stderr"] = subprocess.DEVNULL
    context = SparkContext(conf=conf, gateway=launch_gateway(conf, popen_kwargs=launch))
    _quiet_accumulator_server(context)
    spark = SparkSession(context)
    register(spark)
    return spark


def _quiet_accumulator_server(context: Any) -> None:
    """No traceback when the JVM hangs up on PySpark's accumulator server.

    Stopping a streaming query or Spark closes the JVM's end of that connection; when
    the server's handler is polling it then, socketserver prints the handler's
    ``EOFError`` with a traceback (a race). A hang-up is how that connection ends, so
    it is dropped; any other handler error is still printed.
    """
    server = getattr(context, "_accumulatorServer", None)  # PySpark internals
    if server is None:
        return
    report = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], EOFError):
            report(request, client_address)

    server.handle_error = handle_error


def add_spark_log_argument(parser: argparse.ArgumentParser) -> None:
    """``--spark-log LEVEL``: how much of Spark's own log to show (see :func:`spark_session`)."""
    parser.add_argument("--spark-log", choices=SPARK_LOG_LEVELS, default="off",
                        help="Spark's own log on stderr from this level (default: off)")


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


# ------------------------------------------------------------------ running and stopping


class SparkInterrupt:
    """Ctrl-C for a Spark driver, in place of PySpark's own handler.

    PySpark's handler cancels the jobs and raises ``KeyboardInterrupt`` wherever the main
    thread is: nearly always inside a py4j call (``awaitTermination``, an action), which
    py4j reports with pages of tracebacks. This one only records the request and, from
    another thread, stops the streaming queries and then Spark; the main thread's call
    returns (or fails), and :func:`run_spark` exits 130. A Ctrl-C while Spark is still
    starting, or a second one, exits at once (the JVM exits when this process does). The
    JVM and its workers run in a session of their own (:func:`spark_session`): a Ctrl-C in
    the terminal reaches this process only.
    """

    def __init__(self) -> None:
        self.requested = False
        self.spark: Any = None
        self.stopping: threading.Thread | None = None

    def install(self) -> None:
        """Take over SIGINT."""
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if self.requested or self.spark is None:
            os._exit(130)  # nothing to stop yet, or no more waiting
        self.requested = True
        self.stopping = threading.Thread(target=self._stop, name="ctrl-c", daemon=True)
        self.stopping.start()

    def _stop(self) -> None:
        """Stop the streaming queries, then Spark (py4j calls, so not in the handler: the
        main thread may be in the middle of one). ``query.stop()`` lets a running
        ``foreachBatch`` call finish; stopping Spark cancels the jobs still running."""
        try:
            self.spark.sparkContext.setLogLevel("OFF")  # what it stops is not news
            for query in self.spark.streams.active:
                query.stop()
        except Exception:  # Spark is going down anyway; a second Ctrl-C exits at once
            pass
        self.spark.stop()


def run_spark(app: str, job: Callable[[Any], None], log: str = "off") -> NoReturn:
    """Run ``job(spark)`` with :func:`spark_session` and exit: 0 when it returns, 1 after
    one line on stderr when it fails, 130 after Ctrl-C (see :class:`SparkInterrupt`).
    Spark is stopped in every case."""
    configure_logging("error")  # as run_example: figtank clients' lines, errors only
    interrupt = SparkInterrupt()
    interrupt.install()
    spark: Any = None
    status = 0
    try:
        # Started in another thread, the SparkContext leaves SIGINT alone (PySpark
        # installs its handler from the main thread only).
        with ThreadPoolExecutor(1) as starting:
            spark = interrupt.spark = starting.submit(spark_session, app, log).result()
        job(spark)
    except Exception as exc:
        if not interrupt.requested:  # after a Ctrl-C, failing calls are expected
            if not _expected(exc):
                raise
            hidden = spark is None and log == "off"  # e.g. the JVM did not start: why?
            fail(spark_error_line(exc)
                 + (" (--spark-log warn shows Spark's own output)" if hidden else ""))
            status = 1
    finally:
        if interrupt.stopping is not None:
            interrupt.stopping.join()
        if spark is not None:
            spark.stop()  # again after a Ctrl-C: a no-op
    sys.exit(130 if interrupt.requested else status)


def _expected(exc: BaseException) -> bool:
    """A failure worth one line: Spark's (an analysis error, a failed query or task, the
    JVM's), or a client's or the operating system's."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return isinstance(exc, (PySparkException, Py4JError, *EXPECTED))


def spark_error_line(exc: BaseException) -> str:
    """One line for a failure that went through Spark: the message of what a Python
    worker raised (a figtank client's error, a bad option: Spark quotes the worker's
    traceback in its own message), else the first line of Spark's message."""
    text = str(exc).strip()
    if PYTHON_TRACEBACK in text:  # the last one's first line not indented: what it raised
        tail = text.rsplit(PYTHON_TRACEBACK, 1)[1]
        for line in tail.splitlines():
            if raised := RAISED.match(line):
                return raised.group(1)
    return text.splitlines()[0] if text else type(exc).__name__


PYTHON_TRACEBACK = "Traceback (most recent call last):"
RAISED = re.compile(r"^[A-Za-z_][\w.]*: (.+)$")  # "module.SomeError: message"


# ------------------------------------------------------------------ Figg clients


def publish(figg: tuple[str, int], topic: str, rate: float, keys: int, count: int) -> None:
    """Publish random events at ``rate`` a second (``count`` of them, or until Ctrl-C)."""
    from gateway.client.figg_blocking import BlockingFiggClient

    with BlockingFiggClient(*figg, **FIGG_OPTIONS) as client:
        wait_figg_connected(client, figg)
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


def subscribe(figg: tuple[str, int], topic: str, from_start: bool) -> None:
    """Print every message of ``topic`` until Ctrl-C."""
    from gateway.client.figg_blocking import BlockingFiggClient

    with BlockingFiggClient(*figg, **FIGG_OPTIONS) as client:
        wait_figg_connected(client, figg)
        subscription = client.subscribe(topic, from_offset=0 if from_start else None)
        print(f"waiting for {topic} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        for message in subscription:
            print(message.data.decode(errors="replace"), flush=True)


def main() -> None:
    """The Figg publisher or subscriber of the pipeline."""
    parser = argparse.ArgumentParser(description="Figg publisher/subscriber of JSON events")
    parser.add_argument("--figg", type=parse_address, default="127.0.0.1:8119",
                        help="Figg listener HOST:PORT")
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
    if args.command == "publish":
        publish(args.figg, args.topic, args.rate, args.keys, args.count)
    else:
        subscribe(args.figg, args.topic, args.from_start)


if __name__ == "__main__":
    run_example(main)
