"""Appends, reads and waits on one partition: the semantics the listeners build on."""

from __future__ import annotations

import os

import pytest
import trio

from gateway.store import (
    BundleTooLarge,
    InvalidBundle,
    InvalidSequence,
    OutOfRange,
    StoreSettings,
    TopicConfig,
    UnknownPartition,
    UnknownTopic,
    open_store,
)
from protocols.tank.bundle import Codec, Message, encode_bundle
from protocols.wire import UINT64_MAX
from tests.store.helpers import (
    all_messages,
    as_tuples,
    bundle,
    chunk_messages,
    hold_fsyncs,
    messages,
    segment_names,
    sparse_bundle,
    store_at,
)

MODES = pytest.mark.parametrize("mode", ["fsync", "os"])


@MODES
async def test_sequence_numbers_start_at_one_and_count_messages(tmp_path, mode):
    async with store_at(tmp_path, mode) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        assert (p.first_available, p.high_water_mark) == (0, 0)  # Tank's (0, 0) when empty
        r1 = await p.append(bundle(3, "a"))
        r2 = await p.append(bundle(1, "b"))
        r3 = await p.append(encode_bundle(messages(20, "c")))  # > 15: count as a varint
        assert (r1.first_seq, r1.last_seq) == (1, 3)
        assert (r2.first_seq, r2.last_seq) == (4, 4)
        assert (r3.first_seq, r3.last_seq) == (5, 24)
        assert (p.first_available, p.high_water_mark) == (1, 24)
        got = all_messages(p)
        assert [m.seq for m in got] == list(range(1, 25))
        assert got[0].value == b"a0" and got[3].value == b"b0" and got[4].value == b"c0"
        assert got[0].key == b"k0" and got[1].key is None


@MODES
async def test_sparse_and_explicit_base_sequences(tmp_path, mode):
    async with store_at(tmp_path, mode) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2))                                    # 1, 2
        r = await p.append(sparse_bundle([10, 11, 15]))              # sparse, gap
        assert (r.first_seq, r.last_seq) == (10, 15)
        r = await p.append(bundle(2, "plain"))                       # continues at 16
        assert (r.first_seq, r.last_seq) == (16, 17)
        r = await p.append(bundle(3, "gap"), base_seq=30)            # ProduceWithSeqnum, gap
        assert (r.first_seq, r.last_seq) == (30, 32)
        r = await p.append(bundle(1, "next"), base_seq=33)           # ProduceWithSeqnum, no gap
        assert (r.first_seq, r.last_seq) == (33, 33)
        r = await p.append(bundle(1, "zero"), base_seq=0)            # 0 means "not given"
        assert r.first_seq == 34
        for bad in (lambda: p.append(sparse_bundle([34, 40])),
                    lambda: p.append(sparse_bundle([5])),
                    lambda: p.append(bundle(1), base_seq=34),
                    lambda: p.append(sparse_bundle([50, 51]), base_seq=49)):
            with pytest.raises(InvalidSequence):
                await bad()
        assert p.high_water_mark == 34
        seqs = [m.seq for m in all_messages(p)]
        assert seqs == [1, 2, 10, 11, 15, 16, 17, 30, 31, 32, 33, 34]
        values = {m.seq: m.value for m in all_messages(p, fetch_size=1)}
        assert values[30] == b"gap0" and values[32] == b"gap2" and values[33] == b"next0"


async def test_gap_bundle_is_stored_sparse_so_a_reopen_keeps_its_sequences(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2))
        await p.append(bundle(2, "g", codec=Codec.SNAPPY), base_seq=100)
        await p.append(bundle(1, "after"))
    async with store_at(tmp_path) as store:
        p = store.partition("t", 0)
        got = all_messages(p)
        assert [(m.seq, m.value) for m in got] == [
            (1, b"m0"), (2, b"m1"), (100, b"g0"), (101, b"g1"), (102, b"after0")]
        with p.read(100, 1) as r:
            assert r.first_bundle_sparse and r.base_seq == 100


async def test_gap_bundle_opening_a_segment_is_stored_as_is(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        data = bundle(3)
        await p.append(data, base_seq=500)  # the first segment's base names it
        assert segment_names(p)[0].startswith("500_")
        with p.read(0, 1) as r:
            assert not r.first_bundle_sparse and r.base_seq == 500
            assert r.read_bytes()[1:] == data
        assert p.first_available == 500


@MODES
async def test_read_resolves_zero_and_tail_and_refuses_out_of_range(tmp_path, mode):
    async with store_at(tmp_path, mode) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        with p.read(0, 100) as r:  # empty partition: first available is the tail
            assert r.at_tail and r.seq == 1 and r.high_water_mark == 0
        await p.append(bundle(5))
        with p.read(0, 100) as r:
            assert r.seq == 1 and r.base_seq == 1 and not r.at_tail
        with p.read(UINT64_MAX, 100) as r:
            assert r.at_tail and r.seq == 6 and r.fileno() == -1
            assert r.sendfile_source() is None and r.read_bytes() == b""
        with p.read(6, 100) as r:
            assert r.at_tail
        with pytest.raises(OutOfRange) as exc:
            p.read(7, 100)
        assert (exc.value.first_available, exc.value.high_water_mark) == (1, 5)


async def test_read_returns_whole_bundles_from_the_one_holding_the_sequence(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        sizes = []
        for i in range(10):
            data = bundle(4, f"b{i}", size=20)
            sizes.append(len(data) + 1)
            await p.append(data)
        # seq 7 is in the second bundle (5..8): the chunk starts there.
        with p.read(7, 1) as r:
            assert (r.base_seq, r.offset) == (5, sizes[0])
            assert r.length == sizes[1]  # max(1, 32) reached inside the first bundle
            got = chunk_messages(r.read_bytes(), r.base_seq)
            assert [m.seq for m in got] == [5, 6, 7, 8]
        # fetch_size reached exactly at a bundle boundary, and one byte past it
        with p.read(1, sizes[0] + sizes[1]) as r:
            assert r.length == sizes[0] + sizes[1]
        with p.read(1, sizes[0] + sizes[1] + 1) as r:
            assert r.length == sum(sizes[:3])
        with p.read(1, 10**9) as r:  # stops at the high-water mark
            assert r.length == sum(sizes)


async def test_a_single_huge_bundle_comes_whole(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(1, "small"))
        big = encode_bundle([Message(b"x" * 300_000)], codec=Codec.NONE)
        await p.append(big)
        with p.read(2, 10) as r:
            assert r.length == len(big) + 3
            assert chunk_messages(r.read_bytes(), r.base_seq)[0].value == b"x" * 300_000


async def test_reads_never_cross_a_segment(tmp_path):
    async with store_at(tmp_path, segment_bytes=200) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(30):
            await p.append(bundle(2, f"r{i}"))
        assert p.segment_count > 3
        seq = 1
        seen = []
        while seq <= p.high_water_mark:
            with p.read(seq, 10**6) as r:
                got = chunk_messages(r.read_bytes(), r.base_seq, seq)
            seen += got
            seq = got[-1].seq + 1
        assert [m.seq for m in seen] == list(range(1, 61))
        assert seen[-1].value == b"r29" + b"1"


async def test_read_range_survives_roll_and_deletion(tmp_path):
    async with store_at(tmp_path, segment_bytes=100, retention_segments=2) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(3, "first"))
        r = p.read(1, 1000)
        expected = r.read_bytes()
        for i in range(20):  # rolls the segment, then retention deletes it
            await p.append(bundle(3, f"more{i}"))
        assert p.first_available > 1
        assert not any(n.startswith("1_") or n.startswith("1-") for n in segment_names(p))
        source = r.sendfile_source()
        assert source is not None
        assert os.pread(source[0], r.length, source[1]) == expected
        assert r.read_bytes() == expected
        r.close()
        r.close()  # idempotent
        with pytest.raises(OutOfRange):
            p.read(1, 10)


async def test_reads_in_a_sequence_gap_start_at_the_next_bundle(tmp_path):
    async with store_at(tmp_path, segment_bytes=60) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2))
        await p.append(sparse_bundle([20, 25]))
        await p.append(bundle(1, "x", size=80), base_seq=50)  # rolls: a new segment at 50
        await p.append(bundle(1, "y"))
        with p.read(10, 1) as r:
            assert r.first_bundle_sparse and r.base_seq == 20
        with p.read(30, 1) as r:  # between segments
            assert r.base_seq == 50
            assert [m.seq for m in chunk_messages(r.read_bytes(), r.base_seq)] == [50]


@MODES
async def test_bundles_are_validated_before_anything_is_written(tmp_path, mode):
    async with store_at(tmp_path, mode) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        good = bundle(3)
        for bad in (b"", b"\x80", good[:-1], good + b"\x00", b"\x05\x00", bytes([0x81])):
            with pytest.raises(InvalidBundle):
                await p.append(bad)
        assert p.high_water_mark == 0 and p.segment_count == 0
        await p.append(good)
        assert p.high_water_mark == 3


async def test_bundle_size_limit(tmp_path):
    settings = StoreSettings(max_bundle_size=1000, maintenance_interval=float("inf"))
    async with open_store(tmp_path, settings, maintenance=False) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        with pytest.raises(BundleTooLarge):
            await p.append(encode_bundle([Message(b"x" * 2000)], codec=Codec.NONE))
        await p.append(encode_bundle([Message(b"x" * 900)], codec=Codec.NONE))
        assert p.high_water_mark == 1


async def test_unknown_topic_and_partition(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 2)
        with pytest.raises(UnknownTopic):
            store.partition("nope", 0)
        with pytest.raises(UnknownPartition):
            store.partition("t", 2)


@MODES
async def test_waiters_wake_right_after_the_append_becomes_visible(tmp_path, mode):
    async with store_at(tmp_path, mode) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        woke: list[tuple[int, int]] = []

        async def waiter(seq: int) -> None:
            assert await p.wait_for(seq, trio.current_time() + 10)
            woke.append((seq, p.high_water_mark))

        async with trio.open_nursery() as nursery:
            for seq in (1, 3, 3, 5):
                nursery.start_soon(waiter, seq)
            await trio.testing.wait_all_tasks_blocked()
            before = p.appended_bytes
            await p.append(bundle(3))
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(woke) == [(1, 3), (3, 3), (3, 3)]
            assert p.appended_bytes > before
            await p.append(bundle(2))
        assert sorted(woke)[-1] == (5, 5)


async def test_wait_for_times_out_and_returns_at_once_when_already_there(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        start = trio.current_time()
        assert not await p.wait_for(1, start + 0.05)
        assert trio.current_time() - start >= 0.05
        await p.append(bundle(1))
        assert await p.wait_for(1, start)  # past deadline, but already visible
        woken = trio.Event()
        event = trio.Event()  # one event waiting on the partition, with no task of its own
        p.add_waiter(event)

        async def wait_changed() -> None:
            await p.wait_changed()
            woken.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_changed)
            await trio.testing.wait_all_tasks_blocked()
            assert not woken.is_set() and not event.is_set()
            await p.append(bundle(1))
        assert woken.is_set() and event.is_set()


async def test_many_idle_waiters(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        done = 0

        async def waiter() -> None:
            nonlocal done
            if await p.wait_for(1):
                done += 1

        async with trio.open_nursery() as nursery:
            for _ in range(2000):
                nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            await p.append(bundle(1))
        assert done == 2000


async def test_fsync_mode_shows_nothing_before_the_fsync(tmp_path, monkeypatch):
    gate, _ = hold_fsyncs(monkeypatch)
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.append, bundle(2))
            await trio.testing.wait_all_tasks_blocked()
            # written to the file, but not acknowledged-safe yet: invisible
            assert os.path.getsize(p.directory + "/" + segment_names(p)[0]) > 0
            assert p.high_water_mark == 0
            with p.read(0, 100) as r:
                assert r.at_tail
            gate.set()
        assert p.high_water_mark == 2


async def test_group_commit_one_fsync_covers_concurrent_appends(tmp_path, monkeypatch):
    gate, held = hold_fsyncs(monkeypatch)
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        results = []

        async def produce(i: int) -> None:
            results.append(await p.append(bundle(1, f"g{i}")))

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(produce, i)
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(5):  # the fsync threads reach the gate in their own time
                while len(held) < 2:
                    await trio.sleep(0.01)
            # Every append written; two rounds run (held), the rest wait for the next.
            assert len(held) == 2 and p.high_water_mark == 0
            gate.set()
        assert sorted(r.first_seq for r in results) == list(range(1, 201))
        # The appends made while two rounds were held share at most one more round (two in
        # all when the second round gathered them: a loaded machine starts its fsync
        # thread late), never one each.
        assert p._commit.rounds in (2, 3)
        assert sorted(m.value for m in all_messages(p)) == sorted(b"g%d0" % i for i in range(200))


async def test_appends_to_other_partitions_do_not_wait(tmp_path, monkeypatch):
    # partition 0's fsync hangs until released (on a worker thread)
    gate, held = hold_fsyncs(monkeypatch, lambda job: any(
        os.readlink(f"/proc/self/fd/{fd}").find("/t/0/") >= 0 for fd in job.fds))
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 2)
        p0, p1 = store.partition("t", 0), store.partition("t", 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(p0.append, bundle(1))
            with trio.fail_after(5):
                while not held:  # partition 0's fsync thread is at the gate
                    await trio.sleep(0.01)
                r = await p1.append(bundle(1))
            assert r.first_seq == 1 and p0.high_water_mark == 0
            gate.set()
        assert p0.high_water_mark == 1


@MODES
async def test_reopen_keeps_everything(tmp_path, mode):
    async with store_at(tmp_path, mode, segment_bytes=300, index_interval_bytes=128) as store:
        await store.create_topic("t", 3)
        for i in range(3):
            p = store.partition("t", i)
            for j in range(15 * (i + 1)):
                await p.append(bundle(j % 4 + 1, f"p{i}.{j}"))
        before = {i: as_tuples(all_messages(store.partition("t", i))) for i in range(3)}
    async with store_at(tmp_path, mode, segment_bytes=300, index_interval_bytes=128) as store:
        for i in range(3):
            p = store.partition("t", i)
            assert as_tuples(all_messages(p)) == before[i]
            r = await p.append(bundle(1, "after"))
            assert r.first_seq == before[i][-1][0] + 1


async def test_closed_partition_refuses(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(1))
    from gateway.store import StoreClosed
    with pytest.raises(StoreClosed):
        await p.append(bundle(1))
    with pytest.raises(StoreClosed):
        p.read(1, 10)
    assert not await p.wait_for(5)


async def test_topic_config_files_apply(tmp_path):
    async with store_at(tmp_path) as store:
        topic = await store.create_topic("t", 2, "log.segment.bytes=128\n# comment\n")
        assert topic.config.segment_bytes == 128
    (tmp_path / "t" / "1" / "config").write_text("log.segment.bytes = 1kb\n")
    async with store_at(tmp_path) as store:
        assert store.partition("t", 0).config.segment_bytes == 128
        assert store.partition("t", 1).config.segment_bytes == 1024
        (tmp_path / "t" / "1" / "config").write_text("log.segment.bytes = 2kb\n")
        cfg = await store.reload_config("t", 1)
        assert cfg.segment_bytes == 2048 == store.partition("t", 1).config.segment_bytes
        assert isinstance(cfg, TopicConfig)


async def _rounds_reach(p, n: int) -> None:
    with trio.fail_after(5):
        while p._commit.rounds < n:
            await trio.sleep(0.001)


async def test_os_mode_flushes_after_flush_messages(tmp_path):
    async with store_at(tmp_path, "os", flush_messages=5) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(3))
        await p.append(bundle(1))
        await trio.sleep(0.05)
        assert p._commit.rounds == 0  # acknowledged after write(), nothing synced yet
        await p.append(bundle(1))  # 5 messages: Tank's flush.messages
        await _rounds_reach(p, 1)
        await p.append(bundle(4))
        await trio.sleep(0.05)
        assert p._commit.rounds == 1


async def test_os_mode_flushes_after_flush_secs(tmp_path):
    class Clock:
        now = 1_700_000_000.0

        def __call__(self):
            return self.now

    clock = Clock()
    async with store_at(tmp_path, "os", clock=clock, flush_secs=10) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(1))
        clock.now += 5
        await store.maintain()
        await trio.sleep(0.05)
        assert p._commit.rounds == 0
        clock.now += 6
        await store.maintain()
        await _rounds_reach(p, 1)
