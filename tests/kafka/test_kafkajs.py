"""Stock kafkajs (npm, pinned in tests/kafka/kafkajs.py) against the Kafka listener: it
produces with every codec it ships (none and gzip), consumes in a consumer group and
reads back exactly what was produced, what a Tank producer and kafka-python compressed
with the codecs kafkajs does not ship (snappy, lz4, zstd) included: figtank serves
compressed data uncompressed by default. Served snappy, kafkajs can not read it (why the
default is what it is)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kafka
import trio

from gateway.client.tank import open_tank_client
from protocols.tank.bundle import Codec, Message, encode_bundle
from tests.kafka.helpers import bootstrap, kafka_server
from tests.kafka.kafkajs import hexed, run_kafkajs, unhexed

#: A group's first join waits for no more members.
FAST_GROUPS = {"group_initial_rebalance_delay_ms": 0}


def _records(tag: bytes, count: int) -> list[tuple[bytes | None, bytes]]:
    """Keyed and unkeyed records, an empty value, values from 1 byte to 2 KB of any byte."""
    out: list[tuple[bytes | None, bytes]] = [(None, b""), (b"", tag), (b"\x00\xff", b"\x00")]
    out += [(b"k%d" % i if i % 2 else None, tag + bytes(range(256)) * (i % 9))
            for i in range(count - 3)]
    return out


def _consume(topic: str, group: str, count: int) -> dict[str, Any]:
    return {"consume": {"topic": topic, "group": group, "count": count}}


async def test_kafkajs_produces_each_codec_and_reads_back_in_a_group(tmp_path: Path) -> None:
    none, gzip, later = _records(b"plain", 30), _records(b"gzip", 40), _records(b"late", 5)
    steps = [
        {"produce": {"topic": "js", "codec": "none", "messages": hexed(none)}},
        {"produce": {"topic": "js", "codec": "gzip", "messages": hexed(gzip)}},
        _consume("js", "g1", 70),
        {"produce": {"topic": "js", "codec": "gzip", "messages": hexed(later)}},
        _consume("js", "g1", 5),  # the same group: from its committed offset
    ]
    async with kafka_server(tmp_path, **FAST_GROUPS) as server:
        with trio.fail_after(60):
            results = await trio.to_thread.run_sync(run_kafkajs, bootstrap(server), steps)
            assert server.tank is not None
            async with open_tank_client(*server.tank) as client:
                stored = (await client.consume("js", 0, 1, fetch_size=1 << 20)).messages
    first, second, read, third, again = results
    assert (first["offsets"], second["offsets"], third["offsets"]) == (
        [[0, 0]], [[0, 30]], [[0, 70]])
    assert read["error"] is None and again["error"] is None
    produced = [(i, k or None, v) for i, (k, v) in enumerate(none + gzip)]
    # kafkajs gives an empty key as an empty buffer, a null one as null.
    assert [(o, k or None, v) for o, k, v in unhexed(read["messages"])] == produced
    assert [k for _, k, _ in unhexed(read["messages"])][:3] == [None, b"", b"\x00\xff"]
    assert read["committed"] == [[0, 70]]
    assert unhexed(again["messages"]) == [(70 + i, k, v) for i, (k, v) in enumerate(later)]
    assert again["committed"] == [[0, 75]]
    # Tank's side: the same 75 messages (the gzip batches stored as Snappy bundles).
    assert [(m.seq, m.value) for m in stored] == [
        (i + 1, v) for i, (_, v) in enumerate(none + gzip + later)]


def _kafka_python_produce(addr: str, topic: str, codec: str,
                          records: list[tuple[bytes | None, bytes]]) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=addr, compression_type=codec, acks=1,
                                   linger_ms=50, request_timeout_ms=5000)
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value, partition=0)
        producer.flush(10)
    finally:
        producer.close(5)


async def test_kafkajs_reads_snappy_lz4_and_zstd_of_other_producers(tmp_path: Path) -> None:
    tank = [Message(b"tank %d " % i * 30, b"t%d" % i if i % 2 else None, 1_700_000_000_000 + i)
            for i in range(50)]
    by_codec = {codec: _records(codec.encode(), 25) for codec in ("snappy", "lz4", "zstd")}
    async with kafka_server(tmp_path, **FAST_GROUPS) as server:
        addr = bootstrap(server)
        with trio.fail_after(60):
            assert server.tank is not None
            async with open_tank_client(*server.tank) as client:
                await client.create_topic("tank", 1)
                await client.produce_bundles(
                    {("tank", 0): encode_bundle(tank, codec=Codec.SNAPPY)})
            for codec, records in by_codec.items():
                await trio.to_thread.run_sync(_kafka_python_produce, addr, codec, codec,
                                              records)
            steps = [_consume("tank", "g", 50)] + [_consume(c, "g", 25) for c in by_codec]
            results = await trio.to_thread.run_sync(run_kafkajs, addr, steps)
    assert [r["error"] for r in results] == [None] * 4
    assert [(o, k, v) for o, k, v in unhexed(results[0]["messages"])] == [
        (i, m.key, m.value) for i, m in enumerate(tank)]
    assert [m["timestamp"] for m in results[0]["messages"]] == [m.timestamp for m in tank]
    for result, records in zip(results[1:], by_codec.values(), strict=True):
        assert [(o, k or None, v) for o, k, v in unhexed(result["messages"])] == [
            (i, k or None, v) for i, (k, v) in enumerate(records)]
        assert result["committed"] == [[0, 25]]


async def test_served_snappy_kafkajs_fails_and_gzip_it_reads(tmp_path: Path) -> None:
    """The failure the default avoids, and a topic served gzip instead."""
    records = _records(b"x", 20)
    topics = {"gz": "gzip", "sn": "snappy"}
    async with kafka_server(tmp_path, kafka_fetch_compression_topics=topics,
                            **FAST_GROUPS) as server:
        with trio.fail_after(60):
            steps = [{"produce": {"topic": t, "codec": "gzip", "messages": hexed(records)}}
                     for t in topics]
            steps += [_consume("gz", "g", 20), _consume("sn", "g", 20)]
            *_, gz, sn = await trio.to_thread.run_sync(run_kafkajs, bootstrap(server), steps)
    assert gz["error"] is None
    assert [(o, k or None, v) for o, k, v in unhexed(gz["messages"])] == [
        (i, k or None, v) for i, (k, v) in enumerate(records)]
    assert sn["messages"] == []
    assert "Snappy compression not implemented" in sn["error"]
