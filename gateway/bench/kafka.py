"""Kafka scenarios: ``kafka-produce`` and ``kafka-consume``, with confluent-kafka
(librdkafka), an unmodified Kafka client, against the Kafka listener (``--kafka``).

librdkafka is blocking and runs its own threads: each worker drives it from one trio
worker thread. The topic is made through the Tank endpoint (``--tank``), as the Tank
scenarios make theirs; counts are checked by the partition's end offsets as the Kafka
endpoint reports them (ListOffsets).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from gateway.bench.endpoints import ensure_topic, tank_client, unique_topic
from gateway.bench.payload import Payloads
from gateway.bench.procs import Share, WorkerResult
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report, samples, total, wall
from gateway.bench.stats import summarize
from gateway.extras import require

if TYPE_CHECKING:  # the bench extra: imported when a scenario runs (_ck)
    from confluent_kafka import Consumer, KafkaError, Producer

CODECS: Final = ("none", "snappy", "lz4", "zstd", "gzip")
#: Distinct payloads a producer cycles through (one per message would cost memory).
_VALUE_POOL: Final = 4096
_MIB: Final = 1024 * 1024
#: Give up reading when nothing arrives for this long (the rest counts as lost).
_IDLE_TIMEOUT: Final = 10.0
#: The optional library these scenarios need: (module, extra).
REQUIRES: Final = ("confluent_kafka", "bench")


class _Delivered(Protocol):
    """A message librdkafka reports delivered (its latency is set then)."""

    def latency(self) -> float: ...


def _ck() -> ModuleType:
    """confluent-kafka, imported when a scenario runs (the ``bench`` extra)."""
    return require(REQUIRES[0], extra=REQUIRES[1], purpose="the Kafka benchmark scenarios")


def _client_config(params: Params) -> dict[str, Any]:
    return {"bootstrap.servers": params["kafka"], "client.id": "figtank-bench",
            "socket.timeout.ms": 10_000,
            # librdkafka logs each failed connect on stderr; the run reports the failure.
            "log_level": 2}


def _wait(params: Params) -> float:
    """Seconds to wait for the endpoint to answer metadata or offsets."""
    timeout: float = params["timeout"]
    return min(15.0, timeout)


def watermarks(params: Params, topic: str) -> tuple[int, int]:
    """``(low, high)`` offsets of partition 0 as the Kafka endpoint reports them
    (ListOffsets earliest and latest); blocking."""
    ck = _ck()
    consumer = ck.Consumer({**_client_config(params), "group.id": "figtank-bench",
                            "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0),
                                                   timeout=_wait(params))
        return int(low), int(high)
    except ck.KafkaException as exc:
        raise ConnectionError(f"Kafka endpoint {params['kafka']}: offsets of {topic}: "
                              f"{exc.args[0]}") from None
    finally:
        consumer.close()


def connect(client: Producer | Consumer, params: Params) -> None:
    """Wait until ``client`` has the topic's metadata; ConnectionError if it can not."""
    ck = _ck()
    try:
        client.list_topics(params["topic"], timeout=_wait(params))
    except ck.KafkaException as exc:
        raise ConnectionError(f"Kafka endpoint {params['kafka']}: metadata: "
                              f"{exc.args[0]}") from None


async def _prepare_topic(params: Params, prefix: str) -> Params:
    """Make the topic (through the Tank endpoint) and learn where it ends now."""
    topic = params["topic"] or unique_topic(prefix)
    async with tank_client(params["tank"]) as client:
        await ensure_topic(client, topic)
    _, high = await trio.to_thread.run_sync(watermarks, params, topic)
    return {**params, "topic": topic, "end_before": high}


def _values(params: Params, first: int, count: int) -> list[bytes]:
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    return [payloads.body(first + i) for i in range(min(count, _VALUE_POOL))]


def _producer_config(params: Params) -> dict[str, Any]:
    """The bench producer's settings, from the scenario's options."""
    return {
        **_client_config(params), "acks": "all", "enable.idempotence": False,
        "compression.type": params["compression"], "linger.ms": params["linger_ms"],
        "batch.size": params["batch_bytes"], "batch.num.messages": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "message.timeout.ms": int(params["timeout"] * 1000)}


def produce_blocking(params: Params, values: list[bytes], count: int,
                     share_start: Callable[[], object],
                     config: dict[str, Any] | None = None, warm_up: str | None = None
                     ) -> tuple[dict[str, int], list[float]]:
    """Produce ``count`` messages to ``params["topic"]`` cycling through ``values``;
    counts and delivery latencies. ``share_start()`` is called (from this thread) once
    connected. ``config``: the producer's librdkafka settings (default: from the
    options of the kafka-* scenarios); ``warm_up``: a topic that gets one message
    before the clock starts (an idempotent producer gets its producer id then)."""
    ck = _ck()
    latencies: list[float] = []
    failed = 0

    def delivered(err: KafkaError | None, msg: _Delivered) -> None:
        nonlocal failed
        if err is not None:
            failed += 1
        else:
            latencies.append(msg.latency())

    producer = ck.Producer({**(config or _producer_config(params)),
                            "on_delivery": delivered})
    topic, pool = params["topic"], len(values)
    connect(producer, params)  # connected and the topic known before the clock starts
    if warm_up is not None:
        warm(producer, warm_up, values[0], params["timeout"])
    share_start()
    produce, poll = producer.produce, producer.poll
    for i in range(count):
        value = values[i % pool]
        while True:
            try:
                produce(topic, value, partition=0)
                break
            except BufferError:  # the local queue is full: wait for deliveries
                poll(0.005)
        if not i & 0x3FF:
            poll(0)
    undelivered = producer.flush(params["timeout"])
    failed += undelivered
    return {"messages": count - failed, "bytes": (count - failed) * params["size"],
            "failed": failed}, latencies


def warm(producer: Producer, topic: str, value: bytes, timeout: float) -> None:
    """Produce one message to ``topic`` and wait for it (blocking); its delivery report
    goes to a callback of its own, not the producer's."""
    producer.produce(topic, value, partition=0, on_delivery=lambda err, msg: None)
    if producer.flush(timeout):
        raise ConnectionError(f"warming up: a message to {topic} was not delivered")


def _starter(share: Share) -> Callable[[], object]:
    """A blocking function that runs ``share.start()`` in the worker's trio loop."""
    token = trio.lowlevel.current_trio_token()
    return lambda: trio.from_thread.run(share.start, trio_token=token)


# ----------------------------------------------------------------------- kafka-produce


def _add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=200_000, help="messages in all")
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--compression", choices=CODECS, default="none",
                        help="the producer's compression.type")
    parser.add_argument("--linger-ms", type=float, default=5.0,
                        help="the producer's linger.ms (how long it waits to fill a batch)")
    parser.add_argument("--batch-bytes", type=int, default=_MIB,
                        help="the producer's batch.size (bytes per partition batch)")


def _refuse_tls(args: argparse.Namespace) -> None:
    if args.tls or args.ca or args.cert or args.tls_key:
        raise ValueError("the kafka scenarios do not take the TLS options yet")


def _produce_params(args: argparse.Namespace) -> Params:
    _refuse_tls(args)
    if args.batch_bytes < 1 or args.linger_ms < 0:
        raise ValueError("--batch-bytes must be positive and --linger-ms not negative")
    return {"messages": args.messages, "size": args.size, "compression": args.compression,
            "linger_ms": args.linger_ms, "batch_bytes": args.batch_bytes}


async def _produce_prepare(params: Params) -> Params:
    return await _prepare_topic(params, "bench-kafka-produce")


async def _produce_work(params: Params, share: Share) -> WorkerResult:
    first, count = share.part(params["messages"])
    if not count:
        await share.start()
        return share.finish({"messages": 0, "bytes": 0, "failed": 0})
    values = _values(params, first, count)
    counts, latencies = await trio.to_thread.run_sync(
        produce_blocking, params, values, count, _starter(share))
    return share.finish(counts, {"delivery": latencies})


async def _produce_finish(params: Params, results: list[WorkerResult]) -> Report:
    _, high = await trio.to_thread.run_sync(watermarks, params, params["topic"])
    failed = total(results, "failed")
    row = Row("produce", total(results, "messages"), wall(results), total(results, "bytes"),
              summarize(samples(results, "delivery")), "delivery")
    check = Check("end offset advanced by", params["messages"], high - params["end_before"],
                  problem=f"{failed:,} messages not delivered" if failed else "")
    return make_report("kafka-produce", params, results, [row], [check])


# ----------------------------------------------------------------------- kafka-consume


def _add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=200_000,
                        help="messages to prepare (with the Kafka producer) before reading")
    parser.add_argument("--size", type=int, default=1000, help="bytes per message")
    parser.add_argument("--compression", choices=CODECS, default="none",
                        help="compression.type of the preparing producer")
    parser.add_argument("--fetch-size", type=int, default=_MIB,
                        help="the consumer's max.partition.fetch.bytes")


def _consume_params(args: argparse.Namespace) -> Params:
    _refuse_tls(args)
    if args.fetch_size < 1:
        raise ValueError("--fetch-size must be positive")
    return {"messages": args.messages, "size": args.size, "compression": args.compression,
            "fetch_size": args.fetch_size, "linger_ms": 5.0, "batch_bytes": _MIB}


async def _consume_prepare(params: Params) -> Params:
    params = await _prepare_topic(params, "bench-kafka-consume")
    if params["messages"]:
        counts, _ = await trio.to_thread.run_sync(
            produce_blocking, params, _values(params, 0, params["messages"]),
            params["messages"], lambda: None)
        if counts["failed"]:
            raise ConnectionError(f"preparing: {counts['failed']:,} messages not delivered")
    low, high = await trio.to_thread.run_sync(watermarks, params, params["topic"])
    return {**params, "first_offset": max(low, params["end_before"]), "end_offset": high}


def consume_blocking(params: Params, start: int, end: int,
                     share_start: Callable[[], object]
                     ) -> tuple[dict[str, int], list[float]]:
    """Read offsets ``start..end-1`` of partition 0 with assign() (no group, no commits);
    counts and the latency of each consume() call."""
    ck = _ck()
    consumer = ck.Consumer({
        **_client_config(params), "group.id": "figtank-bench", "enable.auto.commit": False,
        "enable.auto.offset.store": False, "enable.partition.eof": True,
        "max.partition.fetch.bytes": params["fetch_size"],
        "fetch.message.max.bytes": params["fetch_size"],
        # librdkafka stops fetching for 1 s (its default) when its local queue is full,
        # which a server faster than this Python loop triggers: the run would measure
        # that pause. 10 ms keeps the queue fed without busy fetching.
        "fetch.queue.backoff.ms": 10})
    got = size = gaps = repeats = 0
    latencies: list[float] = []
    try:
        connect(consumer, params)
        share_start()
        consumer.assign([ck.TopicPartition(params["topic"], 0, start)])
        expected, idle_since = start, time.monotonic()
        while expected < end:
            sent = time.perf_counter()
            batch = consumer.consume(10_000, timeout=0.5)
            latencies.append(time.perf_counter() - sent)
            if not batch:
                if time.monotonic() - idle_since > _IDLE_TIMEOUT:
                    break
                continue
            idle_since = time.monotonic()
            if batch[-1].error() is not None:  # partition EOF (or a failure): the end
                eof = batch.pop()
                if eof.error().code() != ck.KafkaError._PARTITION_EOF:
                    raise ConnectionError(f"consume: {eof.error()}")
                if not batch:
                    break
            if batch[-1].offset() >= end:
                batch = [m for m in batch if m.offset() < end]
                if not batch:
                    break
            first, last = batch[0].offset(), batch[-1].offset()
            if first == expected and last - first + 1 == len(batch):
                expected = last + 1  # contiguous: the common case
            else:
                for m in batch:
                    if m.offset() < expected:
                        repeats += 1
                        continue
                    gaps += m.offset() - expected
                    expected = m.offset() + 1
            got += len(batch)
            size += sum(len(m) for m in batch)
    finally:
        consumer.close()
    return {"messages": got - repeats, "bytes": size, "gaps": gaps + end - expected,
            "repeats": repeats}, latencies


async def _consume_work(params: Params, share: Share) -> WorkerResult:
    span = max(0, params["end_offset"] - params["first_offset"])
    offset, count = share.part(span)
    start = params["first_offset"] + offset
    if not count:
        await share.start()
        return share.finish({"messages": 0, "bytes": 0})
    counts, latencies = await trio.to_thread.run_sync(
        consume_blocking, params, start, start + count, _starter(share))
    return share.finish(counts, {"fetch": latencies})


async def _consume_finish(params: Params, results: list[WorkerResult]) -> Report:
    got = total(results, "messages")
    gaps = total(results, "gaps")
    row = Row("consume", got, wall(results), total(results, "bytes"),
              summarize(samples(results, "fetch")), "fetch",
              note="latency of each consume() call of up to 10,000 messages")
    check = Check("read from the first offset to the end", params["messages"], got,
                  duplicates=total(results, "repeats"),
                  problem=f"{gaps:,} offsets missing" if gaps else "")
    return make_report("kafka-consume", params, results, [row], [check])


SCENARIOS = (
    Scenario("kafka-produce", "Kafka (confluent-kafka): produce N messages of S bytes, "
             "acks=all; counted by the end offsets", _add_produce_arguments,
             _produce_params, _produce_work, _produce_finish, _produce_prepare,
             frozenset({"kafka", "tank"}), REQUIRES),
    Scenario("kafka-consume", "Kafka (confluent-kafka): prepare N messages, then read "
             "them with assign() from the first offset (no group)", _add_consume_arguments,
             _consume_params, _consume_work, _consume_finish, _consume_prepare,
             frozenset({"kafka", "tank"}), REQUIRES),
)
