"""ATTACH offset rules end to end: where subscriptions start, and the switch to live."""

from __future__ import annotations

import pytest
import trio

from gateway.client.figg import open_figg_client
from gateway.store import NO_BOUNDS
from protocols.figg.messages import Attached, Data
from tests.figg.helpers import RawPeer, attach, figg_server, open_test_backend, publish

FAST = {"backoff": lambda attempt: 0.0 if attempt == 0 else 0.02, "ping_interval": 1.0}


async def fill(server, topic: str, n: int) -> None:
    peer = await RawPeer.connect(server)
    await peer.send(*(publish(topic, i, b"%s-%d" % (topic.encode(), i)) for i in range(1, n + 1)))
    await peer.receive(n)
    await peer.aclose()


@pytest.mark.parametrize(("offset", "attached", "first_data"), [
    (0, 0, 1),          # from the beginning
    (4, 4, 5),          # resume after 4
    (9, 9, 10),         # resume after the next to last
    (10, 10, 11),       # at the end: the next message published
    (11, 10, 11),       # one past the end: clamped to the end
    (10**12, 10, 11),   # far in the future: clamped to the end
    (None, 10, 11),     # no flag: from the end
])
async def test_attach_start(tmp_path, offset, attached, first_data):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            await fill(server, "o", 10)
            sub = await RawPeer.connect(server)
            await sub.send(attach("o", offset))
            assert await sub.receive_one() == Attached("o", attached)
            await fill(server, "o", 1)  # message 11 is "o-1"
            got = await sub.receive_one()
            assert got.offset == first_data
            expected = b"o-%d" % first_data if first_data <= 10 else b"o-1"
            assert got == Data("o", first_data, expected)


async def test_attach_to_an_empty_topic(tmp_path):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            for offset in (0, 5, None):
                sub = await RawPeer.connect(server)
                await sub.send(attach("empty", offset))
                assert await sub.receive_one() == Attached("empty", 0)
                await sub.aclose()
            sub = await RawPeer.connect(server)
            await sub.send(attach("empty", 0))
            await sub.receive_one()
            await fill(server, "empty", 2)
            assert [e.offset for e in await sub.receive(2)] == [1, 2]


async def test_history_to_live_under_concurrent_publishing(tmp_path):
    """Subscribers attach from 0 while publishers run: every offset once, in order."""
    total = 4 * 1500
    with trio.fail_after(30):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            results: dict[int, list[tuple[int, bytes]]] = {}

            async def publisher(k: int) -> None:
                async with open_figg_client(server.host, server.port, **FAST) as client:
                    for i in range(total // 4):
                        await client.publish("hl", b"p%d-%d" % (k, i))
                        if i % 100 == 0:
                            await trio.sleep(0.002)
                    await client.wait_all_acked()

            async def subscriber(k: int, delay: float) -> None:
                await trio.sleep(delay)
                async with open_figg_client(server.host, server.port, **FAST) as client:
                    sub = await client.subscribe("hl", from_offset=0)
                    got = results.setdefault(k, [])
                    async for message in sub:
                        got.append((message.offset, message.data))
                        if len(got) == total:
                            return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(fill, server, "hl", 1)
                for k in range(4):
                    nursery.start_soon(publisher, k)
                for k, delay in enumerate((0.0, 0.05, 0.1, 0.2, 0.4)):
                    nursery.start_soon(subscriber, k, delay)
    # total + the one message of fill() minus the last never awaited: compare prefixes.
    reference = results[0]
    for got in results.values():
        offsets = [o for o, _ in got]
        assert offsets == list(range(1, len(got) + 1))
        assert got == reference[:len(got)]
    for k in range(4):  # each publisher's messages in its order
        mine = [d for _, d in reference if d.startswith(b"p%d-" % k)]
        assert mine == [b"p%d-%d" % (k, i) for i in range(len(mine))]


async def test_attach_before_first_available_after_retention(tmp_path):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path, config_bounds=NO_BOUNDS) as backend, \
                figg_server(backend) as server:
            code = await backend.create_topic(
                "ret", 1, "log.segment.bytes=256\nretention.segments.count=2")
            assert code == 0
            pub = await RawPeer.connect(server)
            for i in range(1, 61):  # one bundle per publish: segments roll, old ones go
                await pub.send(publish("ret", i, b"ret-%02d......" % i))
                await pub.receive_one()
            [info] = await backend.discover_partitions("ret")
            first, hwm = info.first_available, info.high_water_mark
            assert hwm == 60 and 1 < first <= 60
            for offset in (0, 1, first - 2, first - 1):
                sub = await RawPeer.connect(server)
                await sub.send(attach("ret", offset))
                assert await sub.receive_one() == Attached("ret", first - 1)
                got = await sub.receive(hwm - first + 1)
                assert [d.offset for d in got] == list(range(first, hwm + 1))
                assert got[0].data == b"ret-%02d......" % first
                await sub.aclose()
            sub = await RawPeer.connect(server)  # inside the retained range: exact
            await sub.send(attach("ret", first + 1))
            assert await sub.receive_one() == Attached("ret", first + 1)
            assert (await sub.receive_one()).offset == first + 2
