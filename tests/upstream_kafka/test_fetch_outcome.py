"""What the upstream-Kafka backend's fetches say beside their chunks, in-process against
the figtank stand-in upstream: where the next read starts (``FetchOutcome.next_seq``,
what the tail reader goes on from) is where the chunk's bundle headers say
(:func:`~protocols.tank.bundle.chunk_end`), from the feed's cache and from history."""

from __future__ import annotations

from pathlib import Path

import trio

from gateway.backend.kafka import open_kafka_backend
from gateway.backend.kafka.settings import UpstreamKafkaSettings
from gateway.core.config import Settings
from gateway.core.contract import FetchRequest, FetchStatus, ProduceBatch, ProduceCode
from protocols.tank.bundle import Message, chunk_end, encode_bundle
from tests.upstream_kafka.helpers import Upstream


async def test_a_fetch_says_where_the_next_read_starts_as_the_chunk_headers_do(
        tmp_path: Path) -> None:
    upstream = Upstream(tmp_path / "up")
    settings = Settings(data_dir=tmp_path / "gw", upstream_kafka=(upstream.address,))
    try:
        with trio.fail_after(60):
            await upstream.start()
            async with open_kafka_backend(UpstreamKafkaSettings.of(settings)) as backend:
                assert await backend.create_topic("n", 1) == 0
                for i in range(10):  # batches of 1 to 4 messages
                    bundle = encode_bundle([Message(b"v%d" % i, timestamp=1000)] * (1 + i % 4))
                    [done] = await backend.produce([ProduceBatch("n", 0, bundle)])
                    assert done.code is ProduceCode.OK
                hwm = done.last_seq
                assert hwm is not None and hwm > 20
                # The feed opens in the middle: reads before it are history reads.
                order = [*range(hwm // 2, hwm + 1), *range(1, hwm // 2)]
                for seq in order:
                    for size in (1, 100, 4096):
                        [got] = await backend.fetch([FetchRequest("n", 0, seq, size)],
                                                    max_wait_ms=2000, min_bytes=1)
                        assert got.status is FetchStatus.DATA and got.chunk.length
                        data = got.chunk.read_bytes()
                        got.chunk.close()
                        assert got.next_seq == chunk_end(data, got.base_seq, seq)[0], \
                            (seq, size)
                        assert got.next_seq > seq
                feed = backend.feeds.feeds[("n", 0)]
                assert feed.first_cached == hwm // 2 and len(feed.bundles) > 3
    finally:
        upstream.close()
