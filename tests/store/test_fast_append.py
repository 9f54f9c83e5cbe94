"""The one-call appends of ``os`` durability (``Partition._append_plain_now``, and
``Partition.append_plain`` for a bundle its caller validated, as the Tank listener's
one-pass Produce path does) against the general path, their reference: the same appends
give the same outcomes, the same files and the same cached tail."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from gateway.store import Partition, StoreError
from protocols.errors import ProtocolError
from protocols.tank.bundle import Codec, validate_bundle
from tests.store.helpers import all_messages, bundle, sparse_bundle, store_at


class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _entries() -> list[tuple[Any, ...]]:
    """Single-entry appends: plain bundles of every varint length size, compressed ones,
    a chosen sequence with a gap, a sparse bundle, bad and oversized bundles."""
    out: list[tuple[Any, ...]] = []
    for i in range(40):
        size = (10, 200, 3000, 20_000)[i % 4]
        out.append((bundle(1 + i % 7, f"p{i}-", size=size), None))
    out.append((bundle(3, "z", codec=Codec.SNAPPY), None))
    out.append((bundle(2, "g"), 500))  # a gap: stored sparse
    out.append((bundle(2, "after"), 0))  # 0: not given
    out.append((sparse_bundle([600, 603]), None))
    out.append((b"\x01\x02garbage", None))
    out.append((bundle(400, "big", size=300), None))  # over max_bundle_bytes
    out += [(bundle(5, f"q{i}-", size=900), None) for i in range(30)]
    return out


def _validated_plain(entry: tuple[Any, ...]) -> int | None:
    """The message count of an entry a caller of ``append_plain`` would hand it."""
    if entry[1] is not None:
        return None
    try:
        info = validate_bundle(entry[0])
    except ProtocolError:
        return None
    return None if info.sparse else info.msg_count


async def _run(path: str, *, fast: bool, monkeypatch: pytest.MonkeyPatch,
               validated: bool = False, grouped: bool = False
               ) -> tuple[list[Any], dict[str, bytes], list[Any], int]:
    monkeypatch.setattr(Partition, "fast_append", fast)
    taken = []
    real = Partition._append_plain_now

    def counted(self: Partition, entry: Any) -> Any:
        result = real(self, entry)
        if result is not None:
            taken.append(result)
        return result

    monkeypatch.setattr(Partition, "_append_plain_now", counted)
    clock = Clock()
    outcomes: list[Any] = []
    async with store_at(path, "os", clock=clock, tail_cache_bytes=1 << 20,
                        segment_bytes=64 * 1024, index_interval_bytes=1000,
                        index_max_bytes=8 * 12, roll_secs=3600) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        p._env = dataclasses.replace(p._env, max_bundle_size=100_000)
        entries = _entries()
        if grouped:  # several entries a call, as a Produce of many bundles to one partition
            i = 0
            while i < len(entries):
                n = 1 + i % 5
                if i <= 60 < i + n:
                    clock.now += 7200
                p.append_nowait(entries[i:i + n], outcomes.extend)
                i += n
            entries = []
        for i, entry in enumerate(entries):
            if i == 60:
                clock.now += 7200  # the active segment is due to roll by age
            count = _validated_plain(entry) if validated else None
            if count is not None:
                result = p.append_plain(entry[0], count)
                if result is not None:
                    taken.append(result)
                    outcomes.append(result)
                    continue
            p.append_nowait([entry], outcomes.extend)
        hwm, appended = p.high_water_mark, p.appended_bytes
        tail = [(e.first_seq, e.last_seq, e.sparse, e.offset,
                 *p._tail.span(e.first_seq, 1).parts, e.segment.name) for e in p._tail]
        assert len(tail) > 40
        outcomes = [(type(o).__name__, str(o)) if isinstance(o, StoreError) else o
                    for o in outcomes]
        outcomes.append([(m.seq, m.value, m.key) for m in all_messages(p)])
    files = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, path)] = f.read()
    if fast:
        assert len(taken) > 40  # the one-call path did the usual appends
    else:
        assert not taken
    return outcomes, files, tail, hwm * 1_000_000_000 + appended


async def test_fast_append_matches_the_general_path(tmp_path, monkeypatch):
    fast = await _run(str(tmp_path / "fast"), fast=True, monkeypatch=monkeypatch)
    reference = await _run(str(tmp_path / "ref"), fast=False, monkeypatch=monkeypatch)
    assert fast[0] == reference[0]
    assert sorted(fast[1]) == sorted(reference[1])
    for name in fast[1]:
        assert fast[1][name] == reference[1][name], name
    assert fast[2] == reference[2]
    assert fast[3] == reference[3]
    kinds = {o[0] for o in fast[0] if isinstance(o, tuple)}
    assert {"InvalidBundle", "BundleTooLarge"} <= kinds
    assert len([n for n in fast[1] if n.endswith(".log") or n.endswith(".ilog")]) > 2


async def test_append_plain_matches_the_general_path(tmp_path, monkeypatch):
    plain = await _run(str(tmp_path / "plain"), fast=True, monkeypatch=monkeypatch,
                       validated=True)
    reference = await _run(str(tmp_path / "ref"), fast=False, monkeypatch=monkeypatch)
    assert plain[0] == reference[0]
    assert plain[1] == reference[1]
    assert plain[2:] == reference[2:]


async def test_grouped_appends_match_the_general_path(tmp_path, monkeypatch):
    fast = await _run(str(tmp_path / "fast"), fast=True, monkeypatch=monkeypatch,
                      grouped=True)
    reference = await _run(str(tmp_path / "ref"), fast=False, monkeypatch=monkeypatch,
                           grouped=True)
    assert fast[0] == reference[0]
    assert fast[1] == reference[1]
    assert fast[2:] == reference[2:]


async def test_append_plain_declines_what_it_cannot_do_now(tmp_path):
    """None, having done nothing: fsync durability, a segment roll, a closed partition."""
    async with store_at(tmp_path / "fsync", "fsync") as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(1))
        assert p.append_plain(bundle(2), 2) is None
        assert p.high_water_mark == 1
    async with store_at(tmp_path / "os", "os", segment_bytes=4096) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        assert p.append_plain(bundle(1), 1) is None  # no active segment yet
        await p.append(bundle(1))
        assert p.append_plain(bundle(2, size=1000), 2).last_seq == 3
        assert p.append_plain(bundle(4, size=1000), 4) is None  # would roll the segment
        assert p.high_water_mark == 3
        p.fast_append = False
        assert p.append_plain(bundle(1), 1) is None
    assert p.append_plain(bundle(1), 1) is None  # closed


async def test_fast_append_reads_back(tmp_path):
    async with store_at(tmp_path, "os", tail_cache_bytes=1 << 20) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        got: list[Any] = []
        p.append_nowait([(bundle(1, "first"), None)], got.extend)  # opens the segment
        for i in range(5):
            p.append_nowait([(bundle(3, f"r{i}-", size=150), None)], got.extend)
        assert [(r.first_seq, r.last_seq) for r in got] == [
            (1, 1), (2, 4), (5, 7), (8, 10), (11, 13), (14, 16)]
        assert p.high_water_mark == 16
        msgs = all_messages(p)
        assert [m.seq for m in msgs] == list(range(1, 17))
        assert msgs[-1].value == b"r4-2" + b"." * 146


def test_unrolled_varint_matches_the_reference():
    from gateway.store.partition import _varint
    from protocols.wire import encode_varint

    for n in [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 1 << 30, 12345]:
        assert _varint(n) == bytes(encode_varint(n)), n


async def test_a_read_from_the_tail_cache_is_the_read_from_the_segment_files(tmp_path):
    """Bundles cached across segment rolls, a gap and a sparse bundle: every read served
    from the cache is the one the files give (the same range, up to the boundary past
    the fetch size, never across a segment)."""
    async with store_at(tmp_path, "os", tail_cache_bytes=1 << 20,
                        segment_bytes=4096) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        got: list[Any] = []
        for i in range(30):
            entry = (sparse_bundle([p.high_water_mark + 3, p.high_water_mark + 5])
                     if i == 17 else bundle(1 + i % 4, f"r{i}-", size=100 + 37 * i))
            p.append_nowait([(entry, p.high_water_mark + 4 if i == 9 else None)],
                            got.extend)
        assert not [o for o in got if isinstance(o, StoreError)]
        assert len(p._segments) > 3
        cache = p._tail
        assert cache.first_seq == 1  # all of it cached

        def read(seq: int, size: int) -> tuple[Any, ...]:
            with p.read(seq, size) as r:
                return (r.base_seq, r.first_bundle_sparse, r.offset, r.length, r.next_seq,
                        r.read_bytes(), r.sendfile_source() is None)

        crossed = 0
        for seq in range(1, p.high_water_mark + 1):
            for size in (1, 300, 5000):
                cached = read(seq, size)
                p._tail = None
                try:
                    on_file = read(seq, size)
                finally:
                    p._tail = cache
                assert cached[:6] == on_file[:6], (seq, size)
                assert cached[6] and not on_file[6]  # from memory, from the file
                crossed += size == 5000 and cached[4] <= p.high_water_mark
        assert crossed  # reads that stopped at a segment's end
