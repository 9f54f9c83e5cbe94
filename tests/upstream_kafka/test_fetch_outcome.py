"""What the upstream-Kafka backend's fetches say beside their chunks, in-process against
the figtank stand-in upstream: where the next read starts (``FetchOutcome.next_seq``,
what the tail reader goes on from) is where the chunk's bundle headers say
(:func:`~protocols.tank.bundle.chunk_end`), from the feed's cache and from history; and
what a history read asks the upstream for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.backend.kafka import history
from gateway.backend.kafka.fetcher import NO_WAIT_MS, Fetched, fetch_partition
from gateway.backend.kafka.history import MAX_READ_BYTES, NOTHING_YET_WAIT_MS
from gateway.core.contract import FetchRequest, FetchStatus
from protocols.tank.bundle import Message, chunk_end, decode_chunk
from tests.upstream_kafka.in_process import backend_with_topic, produce, read_once, read_to


async def test_a_fetch_says_where_the_next_read_starts_as_the_chunk_headers_do(
        tmp_path: Path) -> None:
    async with backend_with_topic(tmp_path, "n") as backend:
        async def produce_batches() -> int:
            for i in range(10):  # batches of 1 to 4 messages
                last = await produce(backend, "n",
                                     [Message(b"v%d" % i, timestamp=1000)] * (1 + i % 4))
            return last

        history_end = await produce_batches()
        # A reader at the tail opens the feed there; what comes after goes to its cache,
        # what came before is read from the history.
        [got] = await backend.fetch([FetchRequest("n", 0, history_end + 1, 100)],
                                    max_wait_ms=0, min_bytes=1)
        assert got.status is FetchStatus.DATA and not got.chunk.length
        got.chunk.close()
        hwm = await produce_batches()
        feed = backend.feeds.feeds[("n", 0)]
        while feed.next_seq <= hwm:
            await trio.sleep(0.01)
        assert feed.first_cached == history_end + 1 and len(feed.bundles) > 3
        for seq in [*range(history_end + 1, hwm + 1), *range(1, history_end + 1)]:
            for size in (1, 100, 4096):
                got, data = await read_once(backend, "n", seq, size)
                assert got.next_seq == chunk_end(data, got.base_seq, seq)[0], (seq, size)
                assert got.next_seq > seq
        assert feed.first_cached == history_end + 1


async def test_a_read_behind_the_tail_asks_the_upstream_for_at_most_max_read_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Tank consumer asks 64 MiB a read; the gateway's history reads ask the upstream for
    2 MiB (answers that stay in buffers the allocator keeps), and the reader reads on to
    the end, every message once."""
    asked: list[int] = []

    async def counted(*args: Any, max_bytes: int, **kwargs: Any) -> Fetched:
        asked.append(max_bytes)  # the real Fetch goes on to the upstream
        return await fetch_partition(*args, max_bytes=max_bytes, **kwargs)

    monkeypatch.setattr(history, "fetch_partition", counted)
    async with backend_with_topic(tmp_path, "big") as backend:
        for i in range(6):  # 6 x 1,000 messages of 1 KB: about 6 MB
            hwm = await produce(backend, "big", [Message(b"%d" % i * 1000, timestamp=1000)]
                                * 1000)
        assert hwm == 6000
        assert len(await read_to(backend, "big", hwm)) == hwm
        assert asked and max(asked) == MAX_READ_BYTES < 64 << 20


async def test_a_history_read_answered_too_soon_asks_again_allowed_to_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded Tansu answered a Fetch with a max wait of 1 ms with no records where its
    watermark said there were some (a Tank consumer through one of two gateways got an
    empty read at offset 1). The gateway asks once more, allowed to wait: the first
    answer here is that empty one, the second the upstream's own."""
    waits: list[int] = []

    async def first_too_soon(cluster: Any, topic: str, partition: int, offset: int, *,
                             max_wait_ms: int, **kwargs: Any) -> Fetched:
        waits.append(max_wait_ms)
        got = await fetch_partition(cluster, topic, partition, offset,
                                    max_wait_ms=max_wait_ms, **kwargs)
        if len(waits) == 1:  # what the loaded upstream answered: its watermark, no records
            return Fetched(next_offset=offset, high_watermark=got.high_watermark)
        return got

    monkeypatch.setattr(history, "fetch_partition", first_too_soon)
    async with backend_with_topic(tmp_path, "soon") as backend:
        await produce(backend, "soon", [Message(b"m%d" % i, timestamp=1000)
                                        for i in range(9)])
        got, data = await read_once(backend, "soon", 1, 1 << 20)
        assert [m.value for m in decode_chunk(data, got.base_seq, 1).messages] == [
            b"m%d" % i for i in range(9)]
        assert waits == [NO_WAIT_MS, NOTHING_YET_WAIT_MS]
