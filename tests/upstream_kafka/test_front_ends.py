"""Figg, Tank and Kafka clients through a gateway in upstream-Kafka mode, against a
separate upstream process (figtank's embedded store behind its Kafka listener, and Tansu)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
import trio
from kafka import KafkaConsumer
from kafka.errors import GroupAuthorizationFailedError

from gateway.client.figg import open_figg_client
from gateway.client.tank import TAIL, open_tank_client
from gateway.kafka.services import NO_GROUPS_UPSTREAM
from protocols.tank.bundle import Codec
from tests.bridge.helpers import metric
from tests.upstream_kafka.helpers import (
    AnyUpstream,
    blocking,
    gateway,
    kafka_address,
    upstream_and_gateway,
)


async def test_figg_publish_is_acked_after_the_upstream_and_attach_resume_detach(
        tmp_path: Path, upstream: AnyUpstream) -> None:
    async with upstream_and_gateway(tmp_path, upstream=upstream) as (_, _, served):
        with trio.fail_after(60):
            assert served.figg and served.metrics
            serving = served.events("figtank_serving")[-1]
            assert serving["backend"] == "upstream_kafka" and serving["data_dir"] is None
            values = [b"figg-%03d" % i for i in range(40)]
            async with open_figg_client(*served.figg) as client:
                for value in values[:20]:
                    await client.publish_and_wait("news", value)
                # Each ACK came after the upstream stored the message.
                assert await upstream.stored("news") == list(enumerate(values[:20], 1))
                for value in values[20:]:
                    await client.publish("news", value)
                await client.wait_all_acked()
                # ATTACH from offset 0: everything, offsets = upstream sequences.
                sub = await client.subscribe("news", from_offset=0)
                got = [(m.offset, m.data) for m in [await sub.receive() for _ in values]]
                assert got == list(enumerate(values, 1))
                await client.unsubscribe("news")  # DETACH
                # Resume after offset 25, and live messages after the history.
                sub = await client.subscribe("news", from_offset=25)
                assert sub.start_offset == 25
                await client.publish_and_wait("news", b"live")
                got = [(m.offset, m.data) for m in [await sub.receive() for _ in range(16)]]
                assert got == [*enumerate(values[25:], 26), (41, b"live")]
                # ATTACH without an offset: only what comes next.
                await client.unsubscribe("news")
                tail = await client.subscribe("news")
                assert tail.start_offset == 41
                await client.publish_and_wait("news", b"next")
                message = await tail.receive()
                assert (message.offset, message.data) == (42, b"next")
            assert metric(served.metrics, "figtank_upstream_up") == 1
            assert not (tmp_path / "data").exists()  # no log of its own


async def test_tank_produce_consume_long_poll_discover_and_create(
        tmp_path: Path, upstream: AnyUpstream) -> None:
    async with upstream_and_gateway(tmp_path, upstream=upstream) as (_, _, served):
        with trio.fail_after(60):
            assert served.tank
            async with open_tank_client(*served.tank, request_timeout=10) as tank:
                await tank.create_topic("orders", 3)
                bounds = await tank.discover_partitions("orders")
                assert [(b.first_available, b.high_water_mark) for b in bounds] == [(0, 0)] * 3
                await tank.produce({("orders", 1): [b"a", b"b", b"c"]})
                result = await tank.consume("orders", 1, 1)
                assert [(m.seq, m.value) for m in result.messages] == [
                    (1, b"a"), (2, b"b"), (3, b"c")]
                assert result.high_water_mark == 3

                async def produce_later() -> None:
                    await trio.sleep(0.3)
                    async with open_tank_client(*served.tank) as other:
                        await other.produce({("orders", 1): [b"d"]})

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(produce_later)
                    started = trio.current_time()
                    waited = await tank.consume("orders", 1, 4, max_wait_ms=5000, min_bytes=1)
                    elapsed = trio.current_time() - started
                assert [(m.seq, m.value) for m in waited.messages] == [(4, b"d")]
                assert 0.2 < elapsed < 4.5  # answered by the append, not the timeout
                # A long poll at the tail with nothing coming ends at its max wait.
                empty = await tank.consume("orders", 1, TAIL, max_wait_ms=300)
                assert empty.messages == []
                bounds = await tank.discover_partitions("orders")
                assert [(b.first_available, b.high_water_mark) for b in bounds] == [
                    (0, 0), (1, 4), (0, 0)]
                topics = {t.name: t.partitions for t in await tank.discover_topics()}
                assert topics["orders"] == 3
                # A Snappy bundle of ~200 KB goes up as a Snappy batch in one xerial block
                # (snappy-java writes 32 KiB ones): the upstream reads it whole.
                bulk = [b"%04d:" % i + b"x" * 200 for i in range(1000)]
                await tank.produce({("orders", 2): bulk}, codec=Codec.SNAPPY)
                result = await tank.consume("orders", 2, 1, fetch_size=1 << 20)
                assert [m.value for m in result.messages] == bulk
            # The upstream has the topic, its three partitions and the messages.
            assert await upstream.partitions("orders") == 3
            assert [v for _, v in await upstream.stored("orders", 1)] == [b"a", b"b", b"c",
                                                                          b"d"]
            assert [v for _, v in await upstream.stored("orders", 2)] == bulk


def _kafka_produce(address: str, topic: str, values: list[bytes]) -> list[int]:
    producer = ck.Producer({"bootstrap.servers": address, "acks": "all",
                            "enable.idempotence": True})
    offsets: list[int] = []
    for value in values:
        producer.produce(topic, value, partition=0,
                         on_delivery=lambda err, msg: offsets.append(
                             -1 if err else msg.offset()))
    assert producer.flush(15) == 0
    return offsets


def _kafka_read(address: str, topic: str, offset: int, count: int) -> dict[str, Any]:
    consumer = ck.Consumer({"bootstrap.servers": address, "group.id": "unused",
                            "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        where = ck.TopicPartition(topic, 0, offset)
        consumer.assign([where])
        records: list[tuple[int, bytes]] = []
        errors: list[str] = []
        for _ in range(100):
            for m in consumer.consume(count, 0.2):
                if m.error():
                    errors.append(m.error().name())
                else:
                    records.append((m.offset(), m.value()))
            if len(records) >= count:
                break
        low, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
        [by_time] = consumer.offsets_for_times([ck.TopicPartition(topic, 0, 0)], timeout=10)
        return {"partitions": len(metadata.topics[topic].partitions), "records": records,
                "errors": errors, "watermarks": (low, high), "by_time": by_time.offset}
    finally:
        consumer.close()


def _kafka_python_group(address: str, topic: str) -> str:
    consumer = KafkaConsumer(topic, bootstrap_servers=address, group_id="shared",
                             consumer_timeout_ms=5000)
    try:
        with pytest.raises(GroupAuthorizationFailedError) as refused:
            consumer.poll(timeout_ms=5000)
            consumer.poll(timeout_ms=5000)
        return str(refused.value)
    finally:
        consumer.close()


async def test_kafka_clients_produce_fetch_metadata_list_offsets_and_groups_refused(
        tmp_path: Path, upstream: AnyUpstream) -> None:
    front = gateway(upstream.address)
    try:
        with trio.fail_after(90):
            await upstream.start()
            served = await front.start()
            address = kafka_address(served)
            values = [b"k-%02d" % i for i in range(12)]
            offsets = await blocking(_kafka_produce, address, "events", values)
            assert offsets == list(range(12))
            read = await blocking(_kafka_read, address, "events", 5, 7)
            assert read["records"] == list(zip(range(5, 12), values[5:], strict=True))
            assert read["partitions"] == 1
            assert read["watermarks"] == (0, 12)
            assert read["by_time"] == 0
            # librdkafka's consumer asks for its group's coordinator even when it only
            # assigns: it gets the refusal once, as an event, and reads on.
            assert read["errors"] == ["GROUP_AUTHORIZATION_FAILED"]
            # The upstream holds them at sequence = offset + 1.
            assert await upstream.stored("events") == list(enumerate(values, 1))
            # A consumer group is refused with a clear, non-retriable error.
            message = await blocking(_kafka_python_group, address, "events")
            assert "GroupAuthorizationFailed" in message
            denied = [e for e in served.log_lines if e.get("event") == "kafka_groups_not_served"]
            assert denied and denied[0]["reason"] == NO_GROUPS_UPSTREAM
            assert not (tmp_path / "figtank-offsets.log").exists()
    finally:
        front.close()
        upstream.close()
