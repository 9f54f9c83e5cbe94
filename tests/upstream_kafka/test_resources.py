"""What a gateway holds for its upstream is bounded and shown: connections by lane, tail
feeds and their caches, messages waiting for the cluster's acknowledgement and reads
fetched ahead, scraped from /metrics while clients read and publish."""

from __future__ import annotations

import random
from pathlib import Path

import trio

from gateway.client.tank import open_tank_client
from tests.bridge.helpers import metric
from tests.upstream_kafka.helpers import Upstream, blocking, gateway


async def test_connections_feeds_and_unacknowledged_messages_are_gauges(
        tmp_path: Path) -> None:
    upstream = Upstream(tmp_path / "up")
    front = gateway(upstream.address)
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            served = await front.start()
            assert served.tank and served.metrics

            async def gauge(name: str) -> float:
                return await blocking(metric, served.metrics, name) or 0.0

            async with open_tank_client(*served.tank, request_timeout=10) as tank:
                for topic in ("a", "b", "c"):
                    await tank.create_topic(topic, 2)
                await tank.produce({(t, p): [b"x" * 100] * 50
                                    for t in ("a", "b", "c") for p in (0, 1)})
                assert await gauge("figtank_upstream_unacknowledged_messages") == 0
                # Three readers at the tail of three partitions: three feeds, each its own
                # connection; more readers of the same partitions share them.
                async with trio.open_nursery() as nursery:
                    for topic in ("a", "b", "c"):
                        for _ in range(2):
                            nursery.start_soon(_tail_read, served.tank, topic)
                    with trio.fail_after(10):
                        while await gauge('figtank_upstream_feeds{what="feeds"}') < 3:
                            await trio.sleep(0.1)
                    assert await gauge('figtank_upstream_feeds{what="feeds"}') == 3
                    assert await gauge('figtank_upstream_connections{lane="feed"}') == 3
                    assert await gauge('figtank_upstream_connections{lane="produce"}') == 1
                    assert await gauge('figtank_upstream_connections{lane="main"}') == 1
                    # The feeds opened at the tail (the readers caught up from the
                    # history): what arrives now is what they cache.
                    await tank.produce({("a", 0): [b"wake"], ("b", 0): [b"wake"],
                                        ("c", 0): [b"wake"]})
                with trio.fail_after(10):
                    while await gauge('figtank_upstream_feeds{what="cached_bytes"}') <= 0:
                        await trio.sleep(0.1)
    finally:
        front.close()
        upstream.served.close()


async def _tail_read(address: tuple[str, int], topic: str) -> None:
    """Read partition 0 of ``topic`` up to its end, then wait at the tail for one more."""
    async with open_tank_client(*address, request_timeout=15) as tank:
        seq = 1
        while True:
            got = await tank.consume(topic, 0, seq, max_wait_ms=5000)
            if got.messages:
                seq = got.messages[-1].seq + 1
                if any(m.value == b"wake" for m in got.messages):
                    return


async def test_read_aheads_are_bounded_and_counted(tmp_path: Path) -> None:
    """Two Tank readers going through 6 MB of history each, at once: the reads they did not
    have to wait for are counted as taken, and the gateway held at most the one read-ahead
    it is allowed (two readers would otherwise have one each)."""
    config = tmp_path / "gateway.toml"
    config.write_text("[upstream_kafka]\nread_ahead = 1\n")
    upstream = Upstream(tmp_path / "up")
    front = gateway(upstream.address, "--config", str(config))
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            served = await front.start()
            assert served.tank and served.metrics
            # 1 KB values that do not compress: the reads' sizes are the stored bytes.
            values = [random.Random(i).randbytes(1000) for i in range(6000)]
            held: list[float | None] = []
            read: dict[str, list[bytes]] = {}

            async def reader(topic: str) -> None:
                async with open_tank_client(*served.tank, request_timeout=10) as tank:
                    seq, got_values = 1, read.setdefault(topic, [])
                    while seq <= 6000:
                        got = await tank.consume(topic, 0, seq, fetch_size=64 << 20)
                        got_values += [m.value for m in got.messages if m.seq >= seq]
                        seq = got.next_seq
                        held.append(await blocking(
                            metric, served.metrics, 'figtank_upstream_read_ahead{what="reads"}'))

            async with open_tank_client(*served.tank, request_timeout=10) as tank:
                for topic in ("one", "two"):
                    await tank.create_topic(topic, 1)
                    for i in range(0, 6000, 300):
                        await tank.produce({(topic, 0): values[i:i + 300]})
            async with trio.open_nursery() as nursery:  # two readers at once
                nursery.start_soon(reader, "one")
                nursery.start_soon(reader, "two")
            assert read == {"one": values, "two": values}
            assert None not in held and max(held) <= 1  # one at most (the setting), not two
            taken = 'figtank_upstream_read_aheads_total{outcome="taken"}'
            with trio.fail_after(10):  # (a scrape's text is reused for a moment)
                while (await blocking(metric, served.metrics, taken) or 0) < 2:
                    await trio.sleep(0.1)
            with trio.fail_after(10):  # the last one found nothing after it: none held
                while await blocking(metric, served.metrics,
                                     'figtank_upstream_read_ahead{what="bytes"}') != 0:
                    await trio.sleep(0.1)
    finally:
        front.close()
        upstream.served.close()
