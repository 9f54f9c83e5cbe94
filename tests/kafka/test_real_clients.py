"""The Kafka listener against real, unmodified Kafka clients (confluent-kafka, which is
librdkafka, and kafka-python) on loopback: produce with every codec, consume without a
group, offsets, unknown topics, and interop with the Tank and Figg listeners."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import kafka
import pytest
import trio
from confluent_kafka.admin import AdminClient
from kafka.structs import TopicPartition as KTopicPartition

from gateway.client.figg_blocking import BlockingFiggClient
from gateway.client.tank_blocking import BlockingTankClient
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def produce(addr: str, topic: str, records: list[tuple[bytes | None, bytes]], *,
            codec: str = "none", acks: str = "all", timestamps: list[int] | None = None,
            headers: Any = None) -> list[tuple[Any, int]]:
    """Produce ``records`` to partition 0 with librdkafka; each delivery's (error, offset)."""
    producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr, "compression.type": codec,
                            "acks": acks, "linger.ms": 20})
    reports: list[tuple[Any, int]] = []
    for i, (key, value) in enumerate(records):
        extra = {"timestamp": timestamps[i]} if timestamps else {}
        producer.produce(topic, value=value, key=key, partition=0, headers=headers,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())),
                         **extra)
    assert producer.flush(10) == 0
    return reports


def consume(addr: str, topic: str, offset: int, count: int, **config: Any) -> list[Any]:
    """Read ``count`` messages of partition 0 from ``offset`` with assign() (no group)."""
    consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "unused",
                            "enable.auto.commit": False, **config})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, offset)])
        got: list[Any] = []
        for _ in range(50):
            if len(got) >= count:
                break
            for message in consumer.consume(count - len(got), timeout=0.2):
                assert message.error() is None, message.error()
                got.append((message.offset(), message.key(), message.value(),
                            message.timestamp()[1]))
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", CODECS)
async def test_librdkafka_produces_with_each_codec_and_consumes(tmp_path, codec):
    records = [(b"k%d" % i if i % 2 else None, b"value %d " % i * (i + 1)) for i in range(30)]
    async with kafka_server(tmp_path) as server:
        addr = bootstrap(server)
        with trio.fail_after(20):
            reports = await trio.to_thread.run_sync(
                lambda: produce(addr, "codecs", records, codec=codec))
            got = await trio.to_thread.run_sync(consume, addr, "codecs", 0, 30)
            tail = await trio.to_thread.run_sync(consume, addr, "codecs", 25, 5)
    assert [err for err, _ in reports] == [None] * 30
    assert sorted(offset for _, offset in reports) == list(range(30))
    assert [(o, k, v) for o, k, v, _ in got] == [(i, k, v) for i, (k, v) in enumerate(records)]
    assert [o for o, *_ in tail] == [25, 26, 27, 28, 29]


async def test_earliest_latest_and_offsets_for_times(tmp_path):
    stamps = [1_700_000_000_000 + 1000 * i for i in range(10)]

    def script(addr: str) -> list[Any]:
        produce(addr, "times", [(None, b"%d" % i) for i in range(10)], timestamps=stamps)
        consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "u"})
        try:
            low, high = consumer.get_watermark_offsets(ck.TopicPartition("times", 0),
                                                       timeout=5)
            found = consumer.offsets_for_times(
                [ck.TopicPartition("times", 0, stamps[4] - 1)], timeout=5)
            after = consumer.offsets_for_times(
                [ck.TopicPartition("times", 0, stamps[-1] + 1)], timeout=5)
        finally:
            consumer.close()
        first = consume(addr, "times", ck.OFFSET_BEGINNING, 1)
        return [low, high, found[0].offset, after[0].offset, first]

    async with kafka_server(tmp_path) as server:
        with trio.fail_after(20):
            low, high, found, after, first = await trio.to_thread.run_sync(
                script, bootstrap(server))
            # A consumer at the end waits for what comes next.
            addr = bootstrap(server)
            waiting = trio.to_thread.run_sync(
                lambda: consume(addr, "times", ck.OFFSET_END, 1))
            async with trio.open_nursery() as nursery:
                result: list[Any] = []

                async def read() -> None:
                    result.extend(await waiting)
                nursery.start_soon(read)
                await trio.sleep(1.0)
                await trio.to_thread.run_sync(produce, addr, "times", [(None, b"late")])
    assert (low, high) == (0, 10)
    assert found == 4  # the first message at or after the time
    assert after == -1  # none: the end
    assert first[0][:3] == (0, None, b"0") and first[0][3] == stamps[0]
    assert [(o, v) for o, _, v, _ in result] == [(10, b"late")]


async def test_kafka_python_detects_versions_produces_and_consumes(tmp_path):
    def script(addr: str) -> list[Any]:
        producer = kafka.KafkaProducer(bootstrap_servers=addr, compression_type="gzip",
                                       acks=1, request_timeout_ms=5000)
        offsets = [producer.send("kp", key=b"k", value=b"m%d" % i, partition=0).get(5).offset
                   for i in range(5)]
        producer.close(5)
        consumer = kafka.KafkaConsumer(bootstrap_servers=addr, enable_auto_commit=False,
                                       consumer_timeout_ms=3000, request_timeout_ms=5000)
        tp = KTopicPartition("kp", 0)
        consumer.assign([tp])
        consumer.seek(tp, 2)
        got = [(m.offset, m.value) for _, m in zip(range(3), consumer, strict=False)]
        ends = consumer.end_offsets([tp])[tp], consumer.beginning_offsets([tp])[tp]
        consumer.close()
        return [offsets, got, ends]

    async with kafka_server(tmp_path) as server:
        with trio.fail_after(20):
            offsets, got, ends = await trio.to_thread.run_sync(script, bootstrap(server))
    assert offsets == [0, 1, 2, 3, 4]
    assert got == [(2, b"m2"), (3, b"m3"), (4, b"m4")]
    assert ends == (5, 0)


async def test_unknown_topic_in_metadata(tmp_path):
    def script(addr: str) -> Any:
        admin = AdminClient({**CONFLUENT, "bootstrap.servers": addr})
        return admin.list_topics(topic="nowhere", timeout=5).topics["nowhere"].error

    async with kafka_server(tmp_path, auto_create_topics=False) as server:
        with trio.fail_after(20):
            error = await trio.to_thread.run_sync(script, bootstrap(server))
    assert error is not None and error.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


async def test_refused_records_are_invalid_record_with_a_reason(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(20):
            reports = await trio.to_thread.run_sync(
                lambda: produce(bootstrap(server), "hdr", [(None, b"x")],
                                headers=[("h", b"v")]))
            long_key = await trio.to_thread.run_sync(
                lambda: produce(bootstrap(server), "hdr", [(b"k" * 256, b"x")]))
            infos = await server.backend.discover_partitions("hdr")
    for err, _ in reports + long_key:
        assert err is not None and err.code() == ck.KafkaError.INVALID_RECORD
    assert infos is not None and infos[0].high_water_mark == 0  # nothing appended


async def test_interop_kafka_tank_figg_see_the_same_messages(tmp_path):
    def script(server: Any) -> list[Any]:
        addr = bootstrap(server)
        produce(addr, "shared", [(b"a", b"one"), (None, b"two")], codec="lz4")
        with BlockingTankClient(*server.tank, request_timeout=5) as tank:
            tanked = [(m.seq, m.key, m.value)
                      for m in tank.consume("shared", 0, 1).messages]
        with BlockingFiggClient(*server.figg) as figg:
            figg.wait_connected(timeout=5)
            sub = figg.subscribe("shared", from_offset=0)
            figged = [(m.offset, m.data) for m in (sub.get(timeout=5), sub.get(timeout=5))]
            figg.publish_and_wait("shared", b"three")
        kafkaed = consume(addr, "shared", 0, 3)
        return [tanked, figged, [(o, v) for o, _, v, _ in kafkaed]]

    async with kafka_server(tmp_path) as server:
        with trio.fail_after(20):
            tanked, figged, kafkaed = await trio.to_thread.run_sync(script, server)
    assert tanked == [(1, b"a", b"one"), (2, None, b"two")]  # seq = offset + 1
    assert figged == [(1, b"one"), (2, b"two")]
    assert kafkaed == [(0, b"one"), (1, b"two"), (2, b"three")]


async def test_an_idempotent_producer_works(tmp_path):
    def script(addr: str) -> tuple[list[tuple[Any, int]], list[Any]]:
        errors: list[Any] = []
        reports: list[tuple[Any, int]] = []
        producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr,
                                "enable.idempotence": True, "error_cb": errors.append})
        for i in range(100):
            producer.produce("idem", b"x%d" % i, partition=0, on_delivery=lambda err, msg:
                             reports.append((err, msg.offset())))
        assert producer.flush(10) == 0
        return reports, errors

    async with kafka_server(tmp_path) as server:
        with trio.fail_after(20):
            reports, errors = await trio.to_thread.run_sync(script, bootstrap(server))
            infos = await server.backend.discover_partitions("idem")
    # InitProducerId is served: the producer gets an id and its batches are sequenced.
    assert errors == []
    assert [err for err, _ in reports] == [None] * 100
    assert sorted(offset for _, offset in reports) == list(range(100))
    assert infos is not None and infos[0].high_water_mark == 100
