"""The codec a Fetch serves compressed data in (``kafka.fetch_compression`` and its
per-topic override ``kafka.fetch_compression_topics``): plain bundles stay uncompressed,
Snappy bundles (what compressed producers stored) come in the chosen codec, zstd only to
a Fetch of version 10 or later (gzip before); and real clients (librdkafka, kafka-python)
read every choice back as produced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import pytest
import trio
from kafka.structs import TopicPartition as KTopicPartition

from gateway.client.tank import open_tank_client
from gateway.core.config import ConfigError, Settings, settings_from_mapping
from protocols.kafka import records as r
from protocols.kafka.batch import Compression, read_batches
from protocols.kafka.types import ApiKey
from protocols.tank.bundle import Codec, Message, encode_bundle
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.raw import call

STAMP = 1_700_000_000_000


def _bundle(first: int, count: int, codec: Codec) -> bytes:
    return encode_bundle([Message(b"value %d " % i * 20, b"k%d" % i, STAMP + i)
                          for i in range(first, first + count)], codec=codec)


async def _fetch_codecs(address: tuple[str, int], topic: str, version: int
                        ) -> list[tuple[Compression, int]]:
    """``(codec, records)`` of each batch of ``topic``/0 from offset 0, fetched raw."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        _, answer = await call(stream, ApiKey.FETCH, version, r.FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 24,
            topics=[r.FetchTopic(topic, [r.FetchPartition(
                0, fetch_offset=0, partition_max_bytes=1 << 24)])]))
    [part] = answer.responses[0].partitions
    assert part.error_code == 0
    return [(b.compression, len(b.records)) for b in read_batches(part.records).batches]


async def test_topics_get_their_codec_and_zstd_only_from_fetch_v10(tmp_path: Path) -> None:
    topics = {"gz": "gzip", "lz": "lz4", "sn": "snappy", "plain": "none"}
    async with kafka_server(tmp_path, kafka_fetch_compression="zstd",
                            kafka_fetch_compression_topics=topics) as server:
        assert server.tank is not None and server.kafka is not None
        async with open_tank_client(*server.tank) as client:
            for topic in ("default", *topics):
                await client.create_topic(topic, 1)
                await client.produce_bundles({(topic, 0): _bundle(0, 3, Codec.NONE)})
                await client.produce_bundles({(topic, 0): _bundle(3, 200, Codec.SNAPPY)})
        got = {(topic, version): await _fetch_codecs(server.kafka, topic, version)
               for topic in ("default", *topics) for version in (4, 9, 10, 12)}
    plain = (Compression.NONE, 3)
    for version in (4, 9):
        assert got["default", version] == [plain, (Compression.GZIP, 200)]
    for version in (10, 12):
        assert got["default", version] == [plain, (Compression.ZSTD, 200)]
    for topic, codec in topics.items():
        for version in (4, 9, 10, 12):
            assert got[topic, version] == [plain, (Compression[codec.upper()], 200)]


def _produce_and_read(addr: str, topic: str) -> list[list[tuple[int, bytes | None, bytes]]]:
    """Produce 40 records with librdkafka (gzip, then uncompressed), read them back with
    librdkafka and with kafka-python."""
    records = [(b"k%d" % i if i % 3 else None, b"event %d " % i * (i % 7 + 1))
               for i in range(40)]
    for codec, part in (("gzip", records[:30]), ("none", records[30:])):
        producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr,
                                "compression.type": codec, "linger.ms": 50})
        for key, value in part:
            producer.produce(topic, value=value, key=key, partition=0)
        assert producer.flush(10) == 0
    consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "unused",
                            "enable.auto.commit": False})
    librdkafka: list[Any] = []
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        for _ in range(50):
            if len(librdkafka) >= 40:
                break
            for message in consumer.consume(40, timeout=0.2):
                assert message.error() is None, message.error()
                librdkafka.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()
    reader = kafka.KafkaConsumer(bootstrap_servers=addr, enable_auto_commit=False,
                                 consumer_timeout_ms=3000, request_timeout_ms=5000)
    try:
        tp = KTopicPartition(topic, 0)
        reader.assign([tp])
        reader.seek(tp, 0)
        python = [(m.offset, m.key, m.value) for _, m in zip(range(40), reader, strict=False)]
    finally:
        reader.close()
    expected = [(i, key, value) for i, (key, value) in enumerate(records)]
    return [expected, librdkafka, python]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_librdkafka_and_kafka_python_read_every_choice(tmp_path: Path, codec: str
                                                             ) -> None:
    async with kafka_server(tmp_path, kafka_fetch_compression=codec) as server:
        with trio.fail_after(30):
            expected, librdkafka, python = await trio.to_thread.run_sync(
                _produce_and_read, bootstrap(server), "events")
            assert server.kafka is not None
            served = await _fetch_codecs(server.kafka, "events", 12)
    assert librdkafka == expected
    assert python == expected
    assert {c for c, _ in served} == {Compression.NONE, Compression[codec.upper()]}


def test_the_settings_parse_and_refuse_an_unknown_codec() -> None:
    parsed = settings_from_mapping({"kafka": {
        "fetch_compression": "gzip", "fetch_compression_topics": {"logs": "zstd"}}})
    assert parsed.kafka_fetch_compression == "gzip"
    assert parsed.kafka_fetch_compression_topics == {"logs": "zstd"}
    assert Settings().kafka_fetch_compression == "none"
    with pytest.raises(ConfigError, match=r"^kafka\.fetch_compression: expected one of"):
        settings_from_mapping({"kafka": {"fetch_compression": "brotli"}})
    with pytest.raises(ConfigError, match=r"^kafka\.fetch_compression_topics: topic 'logs'"):
        settings_from_mapping({"kafka": {"fetch_compression_topics": {"logs": "xz"}}})
    with pytest.raises(ConfigError, match=r"^kafka\.fetch_compression_topics: expected a "):
        settings_from_mapping({"kafka": {"fetch_compression_topics": "zstd"}})
