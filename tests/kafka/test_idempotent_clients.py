"""Idempotent producers with real clients: confluent-kafka (librdkafka) and kafka-python
with ``enable.idempotence``, through a proxy that loses Produce answers after figtank
stored the batch (tests/kafka/proxy.py): the clients retry, and the log holds each record
once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import trio

from gateway.server.run import ServerInfo
from tests.kafka.helpers import CONFLUENT, kafka_server
from tests.kafka.proxy import DropProxy
from tests.kafka.test_real_clients import consume

COUNT = 300


@asynccontextmanager
async def behind_proxy(tmp_path: Path, drops: int
                       ) -> AsyncIterator[tuple[ServerInfo, DropProxy, str]]:
    """figtank advertising a :class:`DropProxy` in front of its Kafka listener."""
    proxy = DropProxy(drops)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        host, port = proxy.address
        async with kafka_server(tmp_path, kafka_advertised=f"{host}:{port}") as server:
            assert server.kafka is not None
            proxy.target = server.kafka
            yield server, proxy, f"{host}:{port}"
        nursery.cancel_scope.cancel()


def confluent_produce(addr: str, topic: str) -> list[tuple[Any, int]]:
    """Produce COUNT values to partition 0 with an idempotent librdkafka producer, one
    batch every few records; each delivery's (error, offset)."""
    producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr,
                            "enable.idempotence": True, "linger.ms": 2,
                            "batch.num.messages": 20, "retry.backoff.ms": 50})
    reports: list[tuple[Any, int]] = []
    for i in range(COUNT):
        producer.produce(topic, value=b"%d" % i, partition=0,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        if i % 25 == 0:
            producer.poll(0.01)
    assert producer.flush(15) == 0
    return reports


def kafka_python_produce(addr: str, topic: str) -> list[int]:
    """Produce COUNT values to partition 0 with kafka-python's idempotent producer; the
    offsets reported."""
    producer = kafka.KafkaProducer(bootstrap_servers=addr, enable_idempotence=True,
                                   acks="all", linger_ms=2, batch_size=200,
                                   retry_backoff_ms=50, request_timeout_ms=5000)
    try:
        futures = [producer.send(topic, value=b"%d" % i, partition=0) for i in range(COUNT)]
        producer.flush(15)
        return [f.get(timeout=5).offset for f in futures]
    finally:
        producer.close(5)


async def read_back(server: ServerInfo, topic: str) -> tuple[int, list[bytes]]:
    """The partition's high water mark and every value in it, read with a Kafka fetch."""
    infos = await server.backend.discover_partitions(topic)
    assert infos is not None
    hwm = infos[0].high_water_mark
    assert server.kafka is not None
    direct = f"{server.kafka[0]}:{server.kafka[1]}"
    got = await trio.to_thread.run_sync(consume, direct, topic, 0, hwm)
    return hwm, [value for _, _, value, _ in got]


def expected() -> list[bytes]:
    return [b"%d" % i for i in range(COUNT)]


async def _run(tmp_path: Path, drops: int, script: Callable[[str, str], Any]
               ) -> tuple[Any, DropProxy, int, list[bytes]]:
    async with behind_proxy(tmp_path, drops) as (server, proxy, addr):
        with trio.fail_after(40):
            result = await trio.to_thread.run_sync(script, addr, "idem")
            hwm, values = await read_back(server, "idem")
    return result, proxy, hwm, values


async def test_librdkafka_retries_after_lost_answers_and_stores_each_record_once(tmp_path):
    reports, proxy, hwm, values = await _run(tmp_path, 3, confluent_produce)
    assert proxy.dropped == 3 and proxy.connections >= 4  # three answers lost, reconnected
    assert [err for err, _ in reports] == [None] * COUNT
    assert sorted(offset for _, offset in reports) == list(range(COUNT))
    assert hwm == COUNT
    assert sorted(values, key=int) == expected() and len(set(values)) == COUNT


async def test_kafka_python_retries_after_lost_answers_and_stores_each_record_once(
        tmp_path):
    offsets, proxy, hwm, values = await _run(tmp_path, 2, kafka_python_produce)
    assert proxy.dropped == 2
    assert sorted(offsets) == list(range(COUNT))
    assert hwm == COUNT
    assert sorted(values, key=int) == expected() and len(set(values)) == COUNT


async def test_a_transactional_producer_fails_clearly(tmp_path):
    def script(addr: str) -> ck.KafkaError:
        producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr,
                                "transactional.id": "tx"})
        try:
            producer.init_transactions(10)
        except ck.KafkaException as exc:
            return exc.args[0]
        raise AssertionError("init_transactions succeeded")

    async with kafka_server(tmp_path) as server:
        assert server.kafka is not None
        with trio.fail_after(20):
            error = await trio.to_thread.run_sync(
                script, f"{server.kafka[0]}:{server.kafka[1]}")
    assert error.fatal()
    assert error.code() == ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert "figtank does not coordinate transactions" in error.str()


async def test_a_kafka_python_transactional_producer_fails_clearly(tmp_path):
    def script(addr: str) -> Exception:
        producer = kafka.KafkaProducer(bootstrap_servers=addr, transactional_id="tx",
                                       request_timeout_ms=5000, max_block_ms=8000)
        try:
            producer.init_transactions()
        except Exception as exc:  # the client's error class, whatever it is
            return exc
        finally:
            producer.close(1)
        raise AssertionError("init_transactions succeeded")

    async with kafka_server(tmp_path) as server:
        assert server.kafka is not None
        with trio.fail_after(20):
            error = await trio.to_thread.run_sync(
                script, f"{server.kafka[0]}:{server.kafka[1]}")
    assert isinstance(error, kafka.errors.TransactionalIdAuthorizationFailedError)
