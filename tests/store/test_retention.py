"""Rolling (size, full index, age) and retention (count, bytes, age) with small segments."""

from __future__ import annotations

import itertools
import re

import trio

from gateway.store import StoreSettings, TopicConfig, open_store
from protocols.wire import UINT64_MAX
from tests.store.helpers import all_messages, bundle, segment_names, store_at


class FakeClock:
    """Wall-clock seconds the test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rolled(names: list[str]) -> list[tuple[int, int, int]]:
    out = []
    for name in names:
        if m := re.fullmatch(r"(\d+)-(\d+)_(\d+)\.ilog", name):
            out.append((int(m[1]), int(m[2]), int(m[3])))
    return out


async def test_rolls_by_size_with_tank_names(tmp_path):
    clock = FakeClock()
    async with store_at(tmp_path, segment_bytes=100, clock=clock) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(12):
            clock.now += 10
            await p.append(bundle(2, f"s{i}", size=12))  # ~35 bytes framed
        names = segment_names(p)
        segs = rolled(names)
        assert len(segs) >= 3
        assert names[-1].endswith(".log") and names[-1].startswith(f"{segs[-1][1] + 1}_")
        for (_, last, _), (nbase, _, _) in itertools.pairwise(segs):
            assert last + 1 == nbase
        for base, last, ts in segs:
            path = tmp_path / "t" / "0" / f"{base}-{last}_{ts}.ilog"
            assert path.stat().st_size <= 100
            assert (tmp_path / "t" / "0" / f"{base}.index").stat().st_size == 8
            assert 1_700_000_000 < ts <= clock.now
        assert len(all_messages(p)) == 24


async def test_a_bundle_larger_than_the_segment_limit_gets_its_own_segment(tmp_path):
    async with store_at(tmp_path, segment_bytes=64) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(1, "a"))
        await p.append(bundle(1, "big", size=500))
        await p.append(bundle(1, "c"))
        sizes = [(tmp_path / "t" / "0" / n).stat().st_size for n in segment_names(p)]
        assert len(sizes) == 3 and sizes[1] > 500
        assert [m.value[:3] for m in all_messages(p)] == [b"a0", b"big", b"c0"]


async def test_rolls_when_the_index_is_full(tmp_path):
    async with store_at(tmp_path, index_interval_bytes=128, index_max_bytes=128) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(40):
            await p.append(bundle(1, f"i{i}", size=140))  # every bundle gets an entry
        segs = rolled(segment_names(p))
        assert segs and segs[0][:2] == (1, 16)
        for base, _, _ in segs:
            assert (tmp_path / "t" / "0" / f"{base}.index").stat().st_size == 128


async def test_retention_by_segment_count(tmp_path):
    async with store_at(tmp_path, segment_bytes=80, retention_segments=2) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(30):
            await p.append(bundle(1, f"c{i}", size=30))
        segs = rolled(segment_names(p))
        assert len(segs) == 2
        assert p.first_available == segs[0][0]
        got = all_messages(p)
        assert got[0].seq == p.first_available and got[-1].seq == 30
        assert sorted(x.name for x in (tmp_path / "t" / "0").iterdir()) == sorted(
            [*segment_names(p), *(f"{b}.index" for b in p._bases)])


async def test_retention_by_bytes(tmp_path):
    async with store_at(tmp_path, segment_bytes=100, retention_bytes=250) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(40):
            await p.append(bundle(1, f"b{i}", size=40))
        total = sum((tmp_path / "t" / "0" / n).stat().st_size
                    for n in segment_names(p) if n.endswith(".ilog"))
        assert 0 < total <= 250
        assert p.first_available > 1


async def test_retention_by_age_at_roll_and_on_the_timer(tmp_path):
    clock = FakeClock()
    async with store_at(tmp_path, segment_bytes=100, retention_secs=3600, clock=clock) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(8):
            await p.append(bundle(1, f"old{i}", size=40))
        old = rolled(segment_names(p))
        assert len(old) >= 2 and p.first_available == 1
        clock.now += 1800
        for i in range(4):
            await p.append(bundle(1, f"mid{i}", size=40))
        assert p.first_available == 1  # nothing is an hour old yet
        clock.now += 1801
        await p.append(bundle(1, "new", size=40))  # rolls: retention runs
        assert all(base > old[-1][1] for base, _, _ in rolled(segment_names(p)))
        first = p.first_available
        assert first > old[-1][1]
        clock.now += 3601
        await store.maintain()  # the timer pass deletes the rest of the rolled segments
        assert rolled(segment_names(p)) == []
        assert p.first_available > first
        assert all_messages(p)[-1].value.startswith(b"new")


async def test_rolls_by_age_on_the_timer_and_keeps_the_high_water_mark(tmp_path):
    clock = FakeClock()
    kw = {"retention_secs": 60, "roll_secs": 600}
    async with store_at(tmp_path, clock=clock, **kw) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(5))
        clock.now += 601
        await store.maintain()
        names = segment_names(p)
        assert rolled(names) == [(1, 5, int(clock.now))]
        assert names[-1] == f"6_{int(clock.now)}.log"
        clock.now += 61
        await store.maintain()
        # every message expired: first available moves past the high-water mark
        assert segment_names(p) == [f"6_{int(clock.now - 61)}.log"]
        assert (p.first_available, p.high_water_mark) == (6, 5)
        with p.read(0, 100) as r:
            assert r.at_tail and r.seq == 6
        with p.read(UINT64_MAX, 100) as r:
            assert r.seq == 6
    async with store_at(tmp_path, clock=clock, **kw) as store:
        p = store.partition("t", 0)
        assert (p.first_available, p.high_water_mark) == (6, 5)
        r = await p.append(bundle(1))
        assert r.first_seq == 6


async def test_cleanup_policy_keeps_everything(tmp_path):
    async with store_at(tmp_path, segment_bytes=80, retention_segments=2,
                        cleanup_policy="cleanup") as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(20):
            await p.append(bundle(1, f"k{i}", size=30))
        assert len(rolled(segment_names(p))) > 2 and p.first_available == 1


async def test_maintenance_task_runs_on_its_own(tmp_path):
    clock = FakeClock()
    settings = StoreSettings(topic_defaults=TopicConfig(segment_bytes=80, retention_secs=10),
                             maintenance_interval=0.01)
    async with open_store(tmp_path, settings, clock=clock) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(10):
            await p.append(bundle(1, f"m{i}", size=30))
        assert p.first_available == 1
        clock.now += 11
        with trio.fail_after(5):
            while p.first_available == 1:
                await trio.sleep(0.01)
        assert p.first_available > 1
