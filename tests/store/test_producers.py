"""Idempotent producers' state kept durably by each partition (``.kafka-producers``):
written with the batch, read back by a new store over the same directory, cut back to the
recovered log end, bounded, compacted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.store import Partition, StoreIOError, StoreSettings, open_store
from gateway.store.producers import (
    COMPACT_SLACK,
    FILE_NAME,
    KEEP_BATCHES,
    RECORD_SIZE,
    ProducerBatch,
    StoredBatch,
)
from tests.store.helpers import bundle, fail_fsyncs, store_at


async def append(partition: Partition, pid: int, seq: int, n: int = 2, epoch: int = 0
                 ) -> tuple[int, int]:
    """An idempotent producer's batch of ``n`` messages; its (first, last) sequence."""
    [result] = await partition.append_many(
        [(bundle(n, f"p{pid}s{seq}-"), None, None, ProducerBatch(pid, epoch, seq, seq + n - 1))])
    assert not isinstance(result, Exception), result
    return result.first_seq, result.last_seq


def records_in(directory: str) -> int:
    size = os.path.getsize(os.path.join(directory, FILE_NAME))
    assert size % RECORD_SIZE == 0
    return size // RECORD_SIZE


async def test_the_state_outlives_the_store(tmp_path: Path) -> None:
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(3))  # not a producer's: no record
        placed = [await append(p, 7, seq) for seq in range(0, 14, 2)]
        other = await append(p, 8, 0, 1, epoch=3)
    async with store_at(tmp_path) as store:
        p = store.partition("t", 0)
        seven, eight = p.stored_producer(7), p.stored_producer(8)
        assert p.stored_producer(9) is None
        assert store.producers.held == p.producer_count == 2
        assert records_in(p.directory) == 8  # nothing dropped: not rewritten
    assert seven is not None and eight is not None
    assert seven.epoch == 0
    assert seven.batches == [StoredBatch(seq, seq + 1, *where) for seq, where
                             in zip(range(4, 14, 2), placed[2:], strict=True)]
    assert placed[0] == (4, 5)
    assert (eight.epoch, eight.batches) == (3, [StoredBatch(0, 0, *other)])


async def test_records_past_the_recovered_log_end_are_dropped(tmp_path: Path) -> None:
    """The last bundle is lost (as an unsynced tail after a crash) while its record is
    not: the record is dropped and the file rewritten, before the sequence numbers are
    used again by other batches."""
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await append(p, 7, 0)
        await append(p, 7, 2)
        [last] = await p.append_many([(bundle(2, "x"), None, None, ProducerBatch(7, 0, 4, 5))])
        assert not isinstance(last, Exception)
        directory = p.directory
    [segment] = [n for n in os.listdir(directory) if n.endswith(".log")]
    path = os.path.join(directory, segment)
    os.truncate(path, os.path.getsize(path) - last.size)
    async with store_at(tmp_path) as store:
        p = store.partition("t", 0)
        assert p.high_water_mark == 4
        state = p.stored_producer(7)
        assert state is not None and [b.last_seq for b in state.batches] == [1, 3]
        assert records_in(directory) == 2
        assert await append(p, 9, 0) == (5, 6)  # sequence numbers 5, 6 again, pid 9's
    async with store_at(tmp_path) as store:
        p = store.partition("t", 0)
        seven, nine = p.stored_producer(7), p.stored_producer(9)
    assert seven is not None and [b.last_offset for b in seven.batches] == [2, 4]
    assert nine is not None and nine.batches == [StoredBatch(0, 1, 5, 6)]


async def test_a_torn_record_is_dropped(tmp_path: Path) -> None:
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await append(p, 7, 0)
        await append(p, 7, 2)
        directory = p.directory
    with open(os.path.join(directory, FILE_NAME), "r+b") as f:
        f.seek(RECORD_SIZE + 5)
        f.write(b"\xff")  # the second record's CRC no longer matches
    async with store_at(tmp_path) as store:
        state = store.partition("t", 0).stored_producer(7)
        assert state is not None and [b.first_seq for b in state.batches] == [0]
        assert records_in(directory) == 1


async def test_a_failed_fsync_takes_the_records_back(tmp_path: Path, monkeypatch) -> None:
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await append(p, 7, 0)
        fail_fsyncs(p, monkeypatch)
        [failed] = await p.append_many([(bundle(2), None, None, ProducerBatch(7, 0, 2, 3))])
        monkeypatch.undo()
        assert isinstance(failed, StoreIOError)
        state = p.stored_producer(7)
        assert state is not None and [b.first_seq for b in state.batches] == [0]
        assert await append(p, 7, 2) == (3, 4)
    async with store_at(tmp_path) as store:
        state = store.partition("t", 0).stored_producer(7)
    assert state is not None and [b.first_offset for b in state.batches] == [1, 3]


async def test_producers_are_bounded_across_partitions_and_counted(tmp_path: Path) -> None:
    evicted: list[int] = []
    settings = StoreSettings(max_producer_states=2, maintenance_interval=float("inf"))
    async with open_store(tmp_path, settings, maintenance=False,
                          on_producer_evicted=lambda: evicted.append(1)) as store:
        await store.create_topic("t", 2)
        zero, one = store.partition("t", 0), store.partition("t", 1)
        await append(zero, 1, 0)
        await append(one, 2, 0)
        await append(zero, 3, 0)  # the store is full: partition 0 forgets producer 1
        assert zero.stored_producer(1) is None and zero.stored_producer(3) is not None
        assert store.producers.held == 2 and len(evicted) == 1
        await append(zero, 4, 0)
        assert store.producers.held == 2 and len(evicted) == 2
    async with open_store(tmp_path, settings, maintenance=False) as store:
        zero, one = store.partition("t", 0), store.partition("t", 1)
        # Read back in partition order: partition 0 forgets 1 (its oldest) for the bound;
        # partition 1 keeps its only one (a partition always may keep one).
        assert zero.stored_producer(1) is None and one.stored_producer(2) is not None
        assert zero.stored_producer(4) is not None
        assert store.producers.held <= 2 + 1


@pytest.mark.parametrize("durability", ["os", "fsync"])
async def test_the_file_is_compacted(tmp_path: Path, durability: str) -> None:
    bound = 2 * KEEP_BATCHES * 2 + COMPACT_SLACK + 1
    async with store_at(tmp_path, durability) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await append(p, 8, 0, 1)
        for seq in range(0, 2 * bound, 8):
            await p.append_many([(bundle(1), None, None, ProducerBatch(7, 0, seq + i, seq + i))
                                 for i in range(8)])
            assert records_in(p.directory) <= bound
        hwm = p.high_water_mark
    async with store_at(tmp_path, durability) as store:
        p = store.partition("t", 0)
        seven, eight = p.stored_producer(7), p.stored_producer(8)
    assert eight is not None and eight.batches == [StoredBatch(0, 0, 1, 1)]
    assert seven is not None
    assert [b.last_offset for b in seven.batches] == list(range(hwm - 4, hwm + 1))
