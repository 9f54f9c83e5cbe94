"""Every Tank request type and error code, client to listener over loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.client.errors import (
    ProduceFailed,
    RequestFailed,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from gateway.client.tank import Message, PartitionBounds, TankClient, open_tank_client
from protocols.tank.bundle import encode_bundle
from protocols.tank.types import ConsumeFlags, CreateTopicError, ProduceError, ReloadConfError
from tests.tank.helpers import RunningServer, tank_server


async def test_produce_and_consume_keys_and_timestamps(client: TankClient) -> None:
    await client.produce({("events", 0): [b"plain", (b"k1", b"keyed"),
                                          Message(b"stamped", key=b"k2", timestamp=1234)]})
    result = await client.consume("events", 0, 1)
    got = [(m.seq, m.key, m.value) for m in result.messages]
    assert got == [(1, None, b"plain"), (2, b"k1", b"keyed"), (3, b"k2", b"stamped")]
    assert result.messages[2].timestamp == 1234
    assert result.messages[0].timestamp > 1_600_000_000_000  # stamped by the client: now
    assert (result.next_seq, result.high_water_mark) == (4, 3)


async def test_one_produce_to_many_topics_and_partitions(client: TankClient) -> None:
    await client.create_topic("multi", 3)
    await client.produce({("multi", 0): [b"a0"], ("multi", 2): [b"c0", b"c1"],
                          ("other", 0): [b"o0"]})
    results = await client.consume_many({("multi", 0): 1, ("multi", 1): 1, ("multi", 2): 1,
                                         ("other", 0): 0})
    assert {k: [m.value for m in r.messages] for k, r in results.items()} == {
        ("multi", 0): [b"a0"], ("multi", 1): [], ("multi", 2): [b"c0", b"c1"],
        ("other", 0): [b"o0"]}


async def test_compression_follows_the_default_rule(client: TankClient) -> None:
    big = [bytes([i % 251]) * 100 for i in range(600)]  # > 512 messages: Snappy
    await client.produce({("snappy", 0): big})
    result = await client.consume("snappy", 0, 1, fetch_size=4 * 1024 * 1024)
    assert [m.value for m in result.messages] == big


async def test_produce_error_codes(client: TankClient, server: RunningServer) -> None:
    await client.create_topic("two", 2)
    with pytest.raises(ProduceFailed) as caught:
        await client.produce_bundles({
            ("two", 0): encode_bundle([Message(b"good", timestamp=1)]),
            ("two", 1): b"\x04\x00garbage",                # malformed bundle
            ("two", 7): encode_bundle([Message(b"x", timestamp=1)]),  # unknown partition
            ("bad name", 0): encode_bundle([Message(b"x", timestamp=1)]),  # no such topic
        })
    assert caught.value.errors == {
        ("two", 1): ProduceError.IO_FAULT, ("two", 7): ProduceError.UNKNOWN_PARTITION,
        ("bad name", 0): ProduceError.UNKNOWN_TOPIC}
    # The good partition was appended; the malformed bundle appended nothing.
    bounds = await client.discover_partitions("two")
    assert (bounds[0].first_available, bounds[0].high_water_mark) == (1, 1)
    assert bounds[1].high_water_mark == 0
    assert server.metric('figtank_requests_total{protocol="tank",result="error",'
                         'type="produce"}') == 1


async def test_unknown_topic_without_auto_create(tmp_path: Path) -> None:
    async with tank_server(tmp_path, auto_create_topics=False) as server, \
            open_tank_client(server.host, server.port) as client:
        with pytest.raises(ProduceFailed) as caught:
            await client.produce({("nope", 0): [b"x"], ("nope", 1): [b"y"]})
        assert caught.value.errors == {("nope", 0): 0xFF, ("nope", 1): 0xFF}
        with pytest.raises(UnknownTopicError):
            await client.discover_partitions("nope")
        assert await client.discover_topics() == []


async def test_auto_create_on_produce(client: TankClient) -> None:
    await client.produce({("fresh", 0): [b"x"]})
    assert [(t.name, t.partitions) for t in await client.discover_topics()] == [("fresh", 1)]


async def test_produce_with_seqnum_and_invalid_sequence(client: TankClient) -> None:
    await client.produce_with_seqnum({("mirror", 0): (100, [b"a", b"b", b"c"])})
    result = await client.consume("mirror", 0, 0)
    assert [(m.seq, m.value) for m in result.messages] == [(100, b"a"), (101, b"b"),
                                                           (102, b"c")]
    with pytest.raises(ProduceFailed) as caught:
        await client.produce_with_seqnum({("mirror", 0): (50, [b"stale"])})
    assert caught.value.errors == {("mirror", 0): ProduceError.INVALID_SEQUENCE}
    # Plain produce continues after the mirrored sequence numbers.
    await client.produce({("mirror", 0): [b"d"]})
    result = await client.consume("mirror", 0, 103)
    assert [(m.seq, m.value) for m in result.messages] == [(103, b"d")]


async def test_sparse_bundles(client: TankClient) -> None:
    sparse = [Message(b"s10", timestamp=1, seq=10), Message(b"s12", timestamp=1, seq=12),
              Message(b"s20", timestamp=1, seq=20)]
    await client.produce({("sparse", 0): sparse}, sparse=True)
    await client.produce({("sparse", 0): [b"after"]})
    result = await client.consume("sparse", 0, 0)
    assert [(m.seq, m.value) for m in result.messages] == [
        (10, b"s10"), (12, b"s12"), (20, b"s20"), (21, b"after")]
    # From the middle of the sparse bundle: the earlier messages are skipped.
    result = await client.consume("sparse", 0, 12)
    assert [m.seq for m in result.messages] == [12, 20, 21]
    # A sparse bundle must start above the high-water mark.
    with pytest.raises(ProduceFailed) as caught:
        await client.produce({("sparse", 0): [Message(b"old", timestamp=1, seq=5)]},
                             sparse=True)
    assert caught.value.errors == {("sparse", 0): ProduceError.INVALID_SEQUENCE}


async def test_create_topic_codes(client: TankClient) -> None:
    await client.create_topic("made", 4, {"log.segment.bytes": "1mb"})
    with pytest.raises(TopicExistsError):
        await client.create_topic("made", 4)
    for name, partitions, config, code in [
            ("bad name", 1, "", CreateTopicError.INVALID_REQUEST),
            ("zero", 0, "", CreateTopicError.INVALID_REQUEST),
            ("cfg", 1, "log.segment.bytes=banana", CreateTopicError.INVALID_CONFIG),
            ("cfg", 1, "no.such.key=1", CreateTopicError.INVALID_CONFIG)]:
        with pytest.raises(RequestFailed) as caught:
            await client.create_topic(name, partitions, config)
        assert caught.value.code == code
    assert [(t.name, t.partitions, t.enabled) for t in await client.discover_topics()] == [
        ("made", 4, True)]


async def test_discover_partitions_all_and_listed(client: TankClient) -> None:
    await client.create_topic("dp", 3)
    await client.produce({("dp", 1): [b"a", b"b"]})
    everything = await client.discover_partitions("dp")
    assert [b.high_water_mark for b in everything] == [0, 2, 0]
    assert everything[1] == PartitionBounds(1, 1, 2)
    # An explicit list, answered in its order; a partition the topic lacks is reported
    # as not servable (the Tank broker aborts here).
    listed = await client.discover_partitions("dp", [1, 9, 0])
    assert [(b.partition, b.high_water_mark, b.error) for b in listed] == [
        (1, 2, 0), (9, 0, ConsumeFlags.UNKNOWN_PARTITION), (0, 0, 0)]
    with pytest.raises(UnknownTopicError):
        await client.discover_partitions("absent")


async def test_reload_conf_codes(client: TankClient, server: RunningServer) -> None:
    await client.create_topic("rc", 2)
    await client.reload_conf("rc", 1)
    with pytest.raises(UnknownPartitionError):
        await client.reload_conf("rc", 5)
    with pytest.raises(UnknownTopicError):
        await client.reload_conf("none", 0)
    (server.settings.data_dir / "rc" / "0" / "config").write_text("log.segment.bytes=x\n")
    with pytest.raises(RequestFailed) as caught:
        await client.reload_conf("rc", 0)
    assert caught.value.code == ReloadConfError.PARSE_ERROR


async def test_status_and_topology(client: TankClient) -> None:
    await client.create_topic("s1", 2)
    await client.create_topic("s2", 3)
    status = await client.status()
    assert (status.topics, status.partitions, status.open_partitions) == (2, 5, 5)
    assert not status.cluster_aware
    assert status.startup_ts > 1_600_000_000
    assert await client.discover_topology() is None


async def test_requests_are_counted_by_type_and_result(client: TankClient,
                                                       server: RunningServer) -> None:
    await client.produce({("m", 0): [b"x" * 100]})
    await client.consume("m", 0, 1)
    await client.status()
    with pytest.raises(TopicExistsError):
        await client.create_topic("m", 1)
    base = 'figtank_requests_total{protocol="tank",'
    assert server.metric(base + 'result="ok",type="produce"}') == 1
    assert server.metric(base + 'result="ok",type="consume"}') == 1
    assert server.metric(base + 'result="ok",type="status"}') == 1
    assert server.metric(base + 'result="error",type="create_topic"}') == 1
    assert server.metric('figtank_bytes_out_total{topic="m"}') > 100
    assert server.metric('figtank_connections{listener="tank",protocol="tank"}') == 1


async def test_connection_limit(tmp_path: Path) -> None:
    async with tank_server(tmp_path, max_connections=1) as server, \
            open_tank_client(server.host, server.port) as first:
        second = await trio.open_tcp_stream(server.host, server.port)
        with trio.fail_after(5):
            assert await second.receive_some(100) == b""  # closed on accept, no Ping
        await second.aclose()
        assert (await first.status()).topics == 0
