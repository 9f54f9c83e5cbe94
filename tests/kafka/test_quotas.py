"""Quotas on the Kafka listener (issue 17): bytes out applies to Fetch record bytes as to
a Tank Consume, bytes in and requests through the shared session; ``throttle_time_ms``
says the wait still ahead. A ``slow`` Kafka listener's principal has the quota; the
``kafka`` listener's has none and is not slowed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import trio
from kafka.structs import TopicPartition as KTopicPartition

from gateway.auth.quotas import parse_quotas
from gateway.core.config import ListenerTable, Settings
from gateway.server.run import ServerInfo, open_server
from protocols.kafka import records as r
from protocols.kafka.types import ApiKey
from tests.kafka.helpers import CONFLUENT
from tests.kafka.raw import call
from tests.kafka.test_kafka_requests import _batch
from tests.test_quotas import delayed

SIZE = 10_000  # bytes per message
COUNT = 40  # messages: 400 kB
RATE = 200_000  # bytes out a second for listener:slow
BURST = 20_000
#: Bytes a fetch may carry: a client under a quota gets the data in small steps.
FETCH_BYTES = 20_000
#: How long COUNT messages take at RATE: after the burst, less the last fetch's bytes
#: (sent before their debt is paid).
EXPECTED_SECS = (COUNT * SIZE - BURST - FETCH_BYTES) / RATE


@asynccontextmanager
async def serving(tmp_path: Path, rule: dict[str, Any]) -> AsyncIterator[ServerInfo]:
    config = Settings(data_dir=tmp_path / "data", durability="os", kafka_listen="127.0.0.1:0",
                      http_listen="",
                      tank_listen="", figg_listen="", metrics_listen="",
                      listeners={"slow": ListenerTable(protocol="kafka",
                                                       address="127.0.0.1:0")})
    rules = parse_quotas([{"who": ["listener:slow"], **rule}])
    async with open_server(config, grace=0.2, quotas=rules) as server:
        yield server


def _addr(info: ServerInfo, name: str) -> str:
    host, port = info.addresses[name][:2]
    return f"{host}:{port}"


def _fill(addr: str) -> None:
    producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr, "linger.ms": 0,
                            "batch.num.messages": 1})  # a bundle a message
    for i in range(COUNT):
        producer.produce("big", value=bytes([i]) * SIZE, partition=0)
    assert producer.flush(10) == 0


def _confluent_read(addr: str) -> float:
    """Seconds librdkafka takes to read every message (fetches of FETCH_BYTES)."""
    consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "unused",
                            "enable.auto.commit": False, "fetch.max.bytes": FETCH_BYTES,
                            "max.partition.fetch.bytes": FETCH_BYTES,
                            "message.max.bytes": FETCH_BYTES,
                            "fetch.wait.max.ms": 100})
    try:
        consumer.assign([ck.TopicPartition("big", 0, 0)])
        start = time.monotonic()
        got = 0
        while got < COUNT and time.monotonic() - start < 20:
            for message in consumer.consume(COUNT, timeout=0.1):
                assert message.error() is None, message.error()
                got += 1
        assert got == COUNT
        return time.monotonic() - start
    finally:
        consumer.close()


def _kafka_python_read(addr: str) -> float:
    """The same with kafka-python, which also pauses for ``throttle_time_ms`` (KIP-219)."""
    consumer = kafka.KafkaConsumer(bootstrap_servers=addr, enable_auto_commit=False,
                                   group_id=None, fetch_max_bytes=FETCH_BYTES,
                                   max_partition_fetch_bytes=FETCH_BYTES,
                                   fetch_max_wait_ms=100, request_timeout_ms=10_000)
    try:
        where = KTopicPartition("big", 0)
        consumer.assign([where])
        consumer.seek(where, 0)
        start = time.monotonic()
        got = 0
        while got < COUNT and time.monotonic() - start < 20:
            got += sum(len(b) for b in consumer.poll(timeout_ms=100).values())
        assert got == COUNT
        return time.monotonic() - start
    finally:
        consumer.close()


async def test_fetch_under_bytes_out_quota_with_real_clients(tmp_path):
    async with serving(tmp_path, {"bytes_out_per_sec": RATE, "burst_bytes_out": BURST}
                       ) as server:
        with trio.fail_after(60):
            await trio.to_thread.run_sync(_fill, _addr(server, "kafka"))
            fast = await trio.to_thread.run_sync(_confluent_read, _addr(server, "kafka"))
            slow = await trio.to_thread.run_sync(_confluent_read, _addr(server, "slow"))
            held = delayed(server, "out")
            # The principal's buckets went with its last connection: kafka-python starts
            # from a full burst too.
            slow_python = await trio.to_thread.run_sync(_kafka_python_read,
                                                        _addr(server, "slow"))
    assert fast < 0.5 * EXPECTED_SECS, fast  # the principal without a quota
    assert 0.7 * EXPECTED_SECS <= slow <= 1.6 * EXPECTED_SECS + 0.5, (slow, EXPECTED_SECS)
    assert held >= 0.5 * EXPECTED_SECS  # librdkafka ignores throttle_time_ms: we held it
    # kafka-python pauses for throttle_time_ms itself: about the rate, not twice the wait.
    assert 0.7 * EXPECTED_SECS <= slow_python <= 1.6 * EXPECTED_SECS + 0.5, slow_python


async def test_throttle_time_in_fetch_responses(tmp_path):
    """Raw requests: a Fetch past the burst tells the wait its bytes impose; the
    unlimited listener says 0; a Produce says 0 (the server holds the next read back)."""
    rule = {"bytes_out_per_sec": RATE, "burst_bytes_out": BURST}
    async with serving(tmp_path, rule) as server:
        with trio.fail_after(20):
            await trio.to_thread.run_sync(_fill, _addr(server, "kafka"))
            answers = {}
            for name in ("kafka", "slow"):
                host, port = server.addresses[name][:2]
                stream = await trio.open_tcp_stream(host, port)
                _, fetched = await call(stream, ApiKey.FETCH, 11, r.FetchRequest(
                    replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=100_000, topics=[
                        r.FetchTopic("big", [r.FetchPartition(
                            partition=0, fetch_offset=0, partition_max_bytes=100_000)])]), 1)
                _, produced = await call(stream, ApiKey.PRODUCE, 7, r.ProduceRequest(
                    acks=1, timeout_ms=1000, topic_data=[r.TopicProduceData(
                        "small", [r.PartitionProduceData(0, _batch(3000))])]), 2)
                size = len(fetched.responses[0].partitions[0].records)
                answers[name] = (size, fetched.throttle_time_ms, produced.throttle_time_ms)
                await stream.aclose()
    size, fetch_ms, produce_ms = answers["slow"]
    assert size >= 90_000
    want = (size - BURST) / RATE * 1000
    assert 0.8 * want <= fetch_ms <= want + 50, (fetch_ms, want)
    assert produce_ms == 0
    assert answers["kafka"][1:] == (0, 0)


async def test_requests_quota_holds_back_kafka_requests(tmp_path):
    """requests_per_sec through the shared session: 20 Metadata requests at 10 a second
    (burst 2) take about 1.8 s; on the other listener they take no time."""
    async with serving(tmp_path, {"requests_per_sec": 10, "burst_requests": 2}) as server:
        took = {}
        with trio.fail_after(20):
            for name in ("kafka", "slow"):
                host, port = server.addresses[name][:2]
                stream = await trio.open_tcp_stream(host, port)
                start = trio.current_time()
                for i in range(20):
                    await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(topics=[]), i)
                took[name] = trio.current_time() - start
                await stream.aclose()
    assert took["kafka"] < 0.5
    assert 1.3 <= took["slow"] <= 4.0, took
