"""Reads behind the tail fetch the next read ahead (``gateway.backend.kafka.history``), in
process against the figtank stand-in upstream: every Fetch the gateway sends is counted
(the real one goes on to the upstream). A reader going through the history takes each
read-ahead, and nothing is fetched twice; what is held at once is bounded by
``upstream_kafka.read_ahead``; one not taken is dropped; one that asks more than its read
or failed is not used, and the read is answered all the same."""

from __future__ import annotations

import gc
import random
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.backend.kafka import history
from gateway.backend.kafka.fetcher import Fetched, fetch_partition
from gateway.backend.kafka.history import MAX_READ_BYTES, HistoryRead
from gateway.backend.kafka.wire import BrokerLost
from gateway.core.contract import FetchRequest
from protocols.tank.bundle import Message, decode_chunk
from tests.upstream_kafka.in_process import backend_with_topic, produce, read_once, read_to

#: 20 bundles of 300 messages of 1 KB: three reads' worth of MAX_READ_BYTES or more (a
#: read ends with the bundle that reaches it).
BUNDLES, PER_BUNDLE = 20, 300
BUNDLE_BYTES = PER_BUNDLE * 1000


def value(bundle: int, i: int) -> bytes:
    """Message ``i`` of bundle ``bundle``: 1 KB that does not compress (the store keeps
    compressed bundles compressed, and a read's size counts stored bytes)."""
    return random.Random(bundle * PER_BUNDLE + i).randbytes(1000)


EXPECTED = [value(b, i) for b in range(BUNDLES) for i in range(PER_BUNDLE)]


async def history_of(backend: Any, topic: str, partition: int = 0) -> int:
    for b in range(BUNDLES):
        hwm = await produce(backend, topic, [Message(value(b, i), timestamp=1000)
                                             for i in range(PER_BUNDLE)], partition)
    return hwm


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Each Fetch a history read sends: (topic, partition, offset)."""
    sent: list[tuple[str, int, int]] = []

    async def counted(cluster: Any, topic: str, partition: int, offset: int,
                      **kwargs: Any) -> Fetched:
        sent.append((topic, partition, offset))
        return await fetch_partition(cluster, topic, partition, offset, **kwargs)

    monkeypatch.setattr(history, "fetch_partition", counted)
    return sent


async def settled(backend: Any) -> None:
    """Until every read-ahead on its way arrived."""
    with trio.fail_after(10):
        while any(not a.arrived.is_set() for a in backend.history._ahead.values()):
            await trio.sleep(0.01)


async def test_a_reader_behind_the_tail_takes_each_read_ahead_and_nothing_is_fetched_twice(
        tmp_path: Path, fetched: list[tuple[str, int, int]]) -> None:
    async with backend_with_topic(tmp_path, "h") as backend:
        # A read-ahead taken is let go at once (its task ends, holding nothing), however
        # long one not taken would be kept.
        backend.history.ahead_secs = 60
        hwm = await history_of(backend, "h")
        values = await read_to(backend, "h", hwm)
        assert values == EXPECTED
        offsets = [offset for _, _, offset in fetched]
        assert len(offsets) >= 3 and offsets == sorted(set(offsets))  # each once, in order
        reads = backend.history.outcomes
        # Every read but the first was a read-ahead (the last read found nothing after).
        assert reads == {"taken": len(offsets) - 1, "dropped": 0, "failed": 0}
        with trio.fail_after(2):
            while backend.history.held():
                await trio.sleep(0.01)
        assert backend.history.held_bytes() == 0
        await trio.sleep(0.05)  # the tasks let go end
        assert not [o for o in gc.get_objects() if type(o) is HistoryRead and o.bundles]


async def test_with_read_ahead_0_each_read_fetches_for_itself(
        tmp_path: Path, fetched: list[tuple[str, int, int]]) -> None:
    async with backend_with_topic(tmp_path, "h", upstream_kafka_read_ahead=0) as backend:
        hwm = await history_of(backend, "h")
        assert len(await read_to(backend, "h", hwm)) == hwm
        assert backend.history.outcomes == {"taken": 0, "dropped": 0, "failed": 0}
        assert len(fetched) >= 3


async def test_read_aheads_held_at_once_are_bounded_by_the_setting(
        tmp_path: Path, fetched: list[tuple[str, int, int]]) -> None:
    """Four readers each read their partition's first part: two read-aheads are held (the
    setting), the other two readers' next reads fetch for themselves."""
    async with backend_with_topic(tmp_path, "p", 4, upstream_kafka_read_ahead=2) as backend:
        for partition in range(4):
            await history_of(backend, "p", partition)
        nexts = {}
        for partition in range(4):
            got, _ = await read_once(backend, "p", 1, partition=partition)
            nexts[partition] = got.next_seq
        await settled(backend)
        assert backend.history.held() == 2
        assert MAX_READ_BYTES < backend.history.held_bytes() <= 2 * (
            MAX_READ_BYTES + BUNDLE_BYTES)
        before = len(fetched)
        for partition in range(4):
            await read_once(backend, "p", nexts[partition], partition=partition)
        assert backend.history.outcomes["taken"] == 2
        # Two reads fetched for themselves; the two that took theirs started one each for
        # their next read (the other two found the bound reached again).
        assert len(fetched) - before == 2 + 2
        assert backend.history.held() <= 2


async def test_a_read_ahead_not_taken_is_dropped(
        tmp_path: Path, fetched: list[tuple[str, int, int]]) -> None:
    async with backend_with_topic(tmp_path, "h") as backend:
        backend.history.ahead_secs = 0.3
        hwm = await history_of(backend, "h")
        got, _ = await read_once(backend, "h", 1)
        await settled(backend)
        assert backend.history.held() == 1 and backend.history.held_bytes() > 0
        with trio.fail_after(5):
            while backend.history.held():
                await trio.sleep(0.05)
        assert backend.history.held_bytes() == 0
        assert backend.history.outcomes == {"taken": 0, "dropped": 1, "failed": 0}
        # The reader that comes back later reads on all the same.
        assert len(await read_to(backend, "h", hwm, seq=got.next_seq or 0)) == \
            hwm - (got.next_seq or 0) + 1


async def test_a_read_asking_less_than_its_read_ahead_holds_is_answered_within_its_ask(
        tmp_path: Path, fetched: list[tuple[str, int, int]]) -> None:
    async with backend_with_topic(tmp_path, "h") as backend:
        await history_of(backend, "h")
        got, _ = await read_once(backend, "h", 1)
        seq = got.next_seq or 0
        await settled(backend)
        small, data = await read_once(backend, "h", seq, 1000)
        assert len(data) < MAX_READ_BYTES // 2  # one bundle, not the read-ahead's 2 MiB
        assert decode_chunk(data, small.base_seq, seq).messages[0].seq == seq
        assert backend.history.outcomes["dropped"] == 1
        assert backend.history.outcomes["taken"] == 0


@pytest.mark.parametrize("error", [BrokerLost("the connection went"),
                                   OSError("something the gateway did not expect")])
async def test_a_read_ahead_that_failed_is_asked_again_by_its_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """Whatever the background Fetch raised, the backend goes on, and the read it was for
    asks again itself."""
    calls = 0

    async def second_lost(*args: Any, **kwargs: Any) -> Fetched:
        nonlocal calls
        calls += 1
        if calls == 2:  # the read-ahead
            raise error
        return await fetch_partition(*args, **kwargs)

    monkeypatch.setattr(history, "fetch_partition", second_lost)
    async with backend_with_topic(tmp_path, "h") as backend:
        hwm = await history_of(backend, "h")
        values = await read_to(backend, "h", hwm)
        assert values == EXPECTED
        assert backend.history.outcomes["failed"] == 1


async def test_what_read_aheads_hold_together_is_bounded_in_bytes(
        tmp_path: Path, fetched: list[tuple[str, int, int]]) -> None:
    """One that would take the bytes held past the bound (an answer of compressed batches
    becomes larger bundles: here, the bound made smaller than a read) is not kept; its
    read asks again itself, and the reader reads on."""
    async with backend_with_topic(tmp_path, "h") as backend:
        backend.history.max_held_bytes = 1_000_000
        hwm = await history_of(backend, "h")
        assert await read_to(backend, "h", hwm) == EXPECTED
        reads = backend.history.outcomes
        assert reads["taken"] == 0 and reads["failed"] >= 2
        assert backend.history.held_bytes() == 0
        offsets = [offset for _, _, offset in fetched]
        assert len(offsets) == 2 * len(set(offsets)) - 1  # each asked twice but the first


async def test_no_read_ahead_for_what_the_feed_caches(tmp_path: Path) -> None:
    """A reader catching up reads the history up to the feed's cache, then the cache: no
    read-ahead is started for a position the cache serves (none is left over)."""
    async with backend_with_topic(tmp_path, "c") as backend:
        backend.history.ahead_secs = 30
        history_end = await history_of(backend, "c")
        # A reader at the tail opens the feed there; what comes next goes to its cache.
        [got] = await backend.fetch([FetchRequest("c", 0, history_end + 1, 100)],
                                    max_wait_ms=0, min_bytes=1)
        got.chunk.close()
        for b in range(5):  # 500 KB: the last history read ends inside the cached part
            hwm = await produce(backend, "c", [Message(value(b, i), timestamp=1000)
                                               for i in range(100)])
        feed = backend.feeds.feeds[("c", 0)]
        with trio.fail_after(10):
            while feed.next_seq <= hwm:
                await trio.sleep(0.01)
        assert len(await read_to(backend, "c", hwm)) == hwm
        assert feed.first_cached == history_end + 1
        assert backend.history.held() == 0  # the last history read started none
        assert backend.history.outcomes["dropped"] == 0


async def test_a_reader_that_goes_away_cancels_the_read_ahead_it_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    started, cancelled = trio.Event(), trio.Event()

    async def second_slow(*args: Any, **kwargs: Any) -> Fetched:
        nonlocal calls
        calls += 1
        if calls == 2:  # the read-ahead: an upstream that takes its time
            started.set()
            try:
                await trio.sleep(60)
            except trio.Cancelled:
                cancelled.set()
                raise
        return await fetch_partition(*args, **kwargs)

    monkeypatch.setattr(history, "fetch_partition", second_slow)
    async with backend_with_topic(tmp_path, "h") as backend:
        await history_of(backend, "h")
        got, _ = await read_once(backend, "h", 1)
        await started.wait()
        with trio.move_on_after(0.2):  # the client went away while its read waited
            await read_once(backend, "h", got.next_seq or 0)
        with trio.fail_after(2):  # its Fetch cancelled, not left to run its 60 s
            await cancelled.wait()
        assert backend.history.held() == 0


async def test_a_read_ahead_that_found_nothing_is_asked_again_by_its_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    async def then_empty(cluster: Any, topic: str, partition: int, offset: int,
                         **kwargs: Any) -> Fetched:
        nonlocal calls
        calls += 1
        got = await fetch_partition(cluster, topic, partition, offset, **kwargs)
        if calls in (2, 3):  # the read-ahead's two tries: an answer with nothing in it
            return Fetched(next_offset=offset, high_watermark=got.high_watermark)
        return got

    monkeypatch.setattr(history, "fetch_partition", then_empty)
    async with backend_with_topic(tmp_path, "h") as backend:
        hwm = await history_of(backend, "h")
        assert await read_to(backend, "h", hwm) == EXPECTED
        assert backend.history.outcomes["failed"] == 1


async def test_a_backend_that_takes_no_more_tasks_reads_without_read_ahead(
        tmp_path: Path) -> None:
    def closed(*args: object) -> None:
        raise RuntimeError("Nursery is closed to new arrivals")

    async with backend_with_topic(tmp_path, "h") as backend:
        backend.history.spawn = closed
        hwm = await history_of(backend, "h")
        assert await read_to(backend, "h", hwm) == EXPECTED
        assert backend.history.held() == 0 and not backend.history._ahead
