"""Bridge mode end to end: a bridge figtank in front of an embedded figtank (a real Tank
broker over loopback). Positions are the upstream's sequence numbers on both sides."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.client.errors import BoundaryError, TopicExistsError, UnknownTopicError
from gateway.client.figg import open_figg_client
from gateway.client.tank import FIRST_AVAILABLE, TAIL, Message, open_tank_client
from gateway.figg.feed import feed_key
from tests.bridge.helpers import address, bridge_server, metric, upstream_server


async def test_figg_publish_through_the_bridge_is_read_upstream(tmp_path: Path) -> None:
    values = [f"order {i}".encode() for i in range(50)]
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank)) as bridge:
            async with open_figg_client(*bridge.figg) as figg:
                for value in values:
                    await figg.publish("orders", value)
                await figg.wait_all_acked()
                sub = await figg.subscribe("orders", from_offset=0)
                via_bridge = [(m.offset, m.data) async for m in _take(sub, len(values))]
            async with open_tank_client(*up.tank, request_timeout=5) as tank:
                result = await tank.consume("orders", 0, FIRST_AVAILABLE)
            direct = [(m.seq, m.value) for m in result.messages]
            assert direct == list(enumerate(values, start=1))
            assert via_bridge == direct
            assert result.high_water_mark == len(values)
            assert metric(bridge, 'figtank_messages_in_total{topic="orders"}') == len(values)


async def test_tank_producer_upstream_reaches_a_figg_subscriber_of_the_bridge(
        tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank)) as bridge, \
                open_tank_client(*up.tank, request_timeout=5) as tank, \
                open_figg_client(*bridge.figg) as figg:
            await tank.produce({("events", 0): [b"before 1", b"before 2"]})
            sub = await figg.subscribe("events")  # live only: starts after the 2 above
            assert sub.start_offset == 2
            await tank.produce({("events", 0): [b"live 3"]})
            await tank.produce({("events", 0): [Message(b"live 4", key=b"k")]})
            got = [(m.offset, m.data) async for m in _take(sub, 2)]
            assert got == [(3, b"live 3"), (4, b"live 4")]
            # A position taken from the broker means the same at the bridge.
            await figg.unsubscribe("events")
            resumed = await figg.subscribe("events", from_offset=1)
            assert [m.offset async for m in _take(resumed, 3)] == [2, 3, 4]


async def test_tank_clients_of_the_bridge_see_upstream_data_and_errors(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank)) as bridge, \
                open_tank_client(*up.tank, request_timeout=5) as direct, \
                open_tank_client(*bridge.tank, request_timeout=5) as client:
            await client.create_topic("metrics", 2)
            with pytest.raises(TopicExistsError):
                await client.create_topic("metrics", 2)
            await client.produce({("metrics", 0): [b"a", b"b"], ("metrics", 1): [b"c"]})
            await direct.produce({("metrics", 0): [b"d"]})
            [from_bridge, from_broker] = [
                await c.consume_many({("metrics", 0): 1, ("metrics", 1): 1})
                for c in (client, direct)]
            for results in (from_bridge, from_broker):
                assert [(m.seq, m.value) for m in results[("metrics", 0)].messages] == [
                    (1, b"a"), (2, b"b"), (3, b"d")]
                assert [m.value for m in results[("metrics", 1)].messages] == [b"c"]

            with pytest.raises(UnknownTopicError):
                await client.consume("nowhere", 0, 1)
            with pytest.raises(BoundaryError) as boundary:
                await client.consume("metrics", 0, 10)
            assert (boundary.value.first_available, boundary.value.high_water_mark) == (1, 3)

            bounds = await client.discover_partitions("metrics")
            assert [(b.first_available, b.high_water_mark) for b in bounds] == [(1, 3), (1, 1)]
            with pytest.raises(UnknownTopicError):
                await client.discover_partitions("nowhere")
            topics = {t.name: t.partitions for t in await client.discover_topics()}
            assert topics == {"metrics": 2}
            status = await client.status()
            assert (status.topics, status.partitions) == (1, 2)
            assert await client.discover_topology() is None

            # A long poll through the bridge wakes when the broker gets the message.
            async with trio.open_nursery() as nursery:
                got: list = []

                async def wait_tail() -> None:
                    result = await client.consume("metrics", 1, TAIL, max_wait_ms=5000)
                    got.extend(m.value for m in result.messages)

                nursery.start_soon(wait_tail)
                await trio.sleep(0.2)
                started = trio.current_time()
                await direct.produce({("metrics", 1): [b"late"]})
            assert got == [b"late"]
            assert trio.current_time() - started < 2


async def _take(sub, count: int):
    n = 0
    async for message in sub:
        yield message
        n += 1
        if n == count:
            return


async def test_figg_subscribers_of_one_partition_share_its_upstream_polls(
        tmp_path: Path) -> None:
    values = [b"v%d" % i for i in range(30)]
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank)) as bridge:
            backend = bridge.backend
            async with open_figg_client(*bridge.figg) as publisher, \
                    open_figg_client(*bridge.figg) as readers:
                await publisher.publish_and_wait("tail", b"v-first")
                # Three subscriptions of one partition ("tail" is "tail/0"), two connections.
                subs = [await readers.subscribe("tail"), await readers.subscribe("tail/0"),
                        await publisher.subscribe("tail")]
                await trio.sleep(0.1)  # every subscription is parked at the tail
                for value in values:
                    await publisher.publish("tail", value)
                await publisher.wait_all_acked()
                for sub in subs:
                    got = [(m.offset, m.data) async for m in _take(sub, len(values))]
                    assert got == list(enumerate(values, start=2))
                # One reader of the partition for the three: both topic names' feeds
                # follow it (each name's DATA frames made once a chunk).
                reader = bridge.listeners["figg"].readers.get("tail", 0)
                assert reader is not None
                assert reader.find(feed_key(b"tail")) is not None
                assert reader.find(feed_key(b"tail/0")) is not None
            fetches = backend.fetches  # type: ignore[union-attr]
            # The upstream Consumes are the reader's polls, not one a subscription.
            assert 0 < fetches.requests <= reader.reads + 1
