"""Crash recovery: torn and corrupt segment tails, broken indexes, failed writes and fsyncs."""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path

import pytest

from gateway.store import StoreIOError
from protocols.tank.bundle import Codec
from tests.store.helpers import (
    all_messages,
    as_tuples,
    bundle,
    fail_fsyncs,
    read_messages,
    segment_names,
    sparse_bundle,
    store_at,
)


async def build(path: Path, last: bytes, **topic) -> tuple[list, int]:
    """A one-partition topic whose active segment ends with ``last``.

    Returns the messages before ``last`` and the file offset where ``last`` starts.
    """
    async with store_at(path, "os", **topic) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2, "a"))
        await p.append(sparse_bundle([5, 7]))
        await p.append(bundle(1, "b", codec=Codec.SNAPPY))
        before = as_tuples(all_messages(p))
        start = p._active.size
        await p.append(last)
    return before, start


def active_file(path: Path) -> Path:
    (log,) = (path / "t" / "0").glob("*.log")
    return log


async def reopen_and_check(path: Path, expected: list) -> None:
    """Reopen: exactly ``expected`` is there (the torn bundle is gone) and appends go on."""
    async with store_at(path, "os") as store:
        p = store.partition("t", 0)
        assert as_tuples(all_messages(p)) == expected
        hwm = p.high_water_mark
        assert hwm == expected[-1][0]
        r = await p.append(bundle(2, "new"))
        assert (r.first_seq, r.last_seq) == (hwm + 1, hwm + 2)
        assert [m.seq for m in all_messages(p)][-3:] == [hwm, hwm + 1, hwm + 2]


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.SNAPPY])
async def test_truncating_the_last_bundle_at_every_offset(tmp_path, codec):
    ref = tmp_path / "ref"
    before, start = await build(ref, bundle(3, "last", codec=codec, size=6))
    data = active_file(ref).read_bytes()
    assert len(data) - start > 10
    for cut in range(start, len(data)):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(ref, work)
        with open(active_file(work), "r+b") as f:
            f.truncate(cut)
        await reopen_and_check(work, before)
        assert active_file(work).stat().st_size >= start  # earlier bundles were not cut
        shutil.rmtree(work)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.SNAPPY])
async def test_flipping_each_byte_of_the_last_bundle(tmp_path, codec):
    ref = tmp_path / "ref"
    last = bundle(3, "last", codec=codec, size=6)
    before, start = await build(ref, last)
    data = active_file(ref).read_bytes()
    hwm_before = before[-1][0]
    last_seqs = [hwm_before + 1, hwm_before + 2, hwm_before + 3]
    dropped = 0
    for pos in range(start, len(data)):
        work = tmp_path / f"flip{pos}"
        shutil.copytree(ref, work)
        with open(active_file(work), "r+b") as f:
            f.seek(pos)
            f.write(bytes([data[pos] ^ 0xFF]))
        async with store_at(work, "os") as store:
            p = store.partition("t", 0)
            got = as_tuples(all_messages(p))
            # Every earlier bundle survives. Tank bundles carry no checksum, so a flip inside
            # a value can go unnoticed: then the bundle is kept and still decodes.
            assert got[:len(before)] == before
            if len(got) == len(before):
                dropped += 1
            else:
                assert [seq for seq, *_ in got[len(before):]] == last_seqs
            r = await p.append(bundle(1, "new"))
            assert r.first_seq == got[-1][0] + 1
        shutil.rmtree(work)
    assert dropped >= 3  # at least the length prefix and header flips are caught


async def test_garbage_after_the_last_bundle_is_cut(tmp_path):
    before, _ = await build(tmp_path, bundle(1, "z"))
    with open(active_file(tmp_path), "ab") as f:
        f.write(b"\x00" * 4096)  # a crash after the file grew but before the data landed
    z = (before[-1][0] + 1, b"z0", b"k0", before[0][3])
    await reopen_and_check(tmp_path, [*before, z])


async def test_zero_byte_active_segment_keeps_the_partition(tmp_path):
    async with store_at(tmp_path, segment_bytes=64) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(6):
            await p.append(bundle(1, f"z{i}", size=40))
        before = as_tuples(all_messages(p))
        names = segment_names(p)
    assert len(names) > 2
    # crash right after a roll created the new active segment: it is empty
    (tmp_path / "t" / "0" / names[-1]).write_bytes(b"")
    (tmp_path / "t" / "0" / names[-1].split("_")[0]).with_suffix(".index").write_bytes(b"")
    async with store_at(tmp_path, segment_bytes=64) as store:
        p = store.partition("t", 0)
        assert as_tuples(all_messages(p)) == before[:-1]
        r = await p.append(bundle(1, "again"))
        assert r.first_seq == before[-1][0]


async def test_zero_byte_only_segment(tmp_path):
    pdir = tmp_path / "t" / "0"
    pdir.mkdir(parents=True)
    (pdir / "41_1700000000.log").write_bytes(b"")
    async with store_at(tmp_path) as store:
        p = store.partition("t", 0)
        assert (p.first_available, p.high_water_mark) == (41, 40)
        r = await p.append(bundle(2))
        assert r.first_seq == 41
        assert all_messages(p)[0].seq == 41


def _index(path: Path) -> Path:
    (index,) = (path / "t" / "0").glob("*.index")
    return index


async def _build_indexed(path: Path) -> list:
    async with store_at(path, "os", index_interval_bytes=128) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(40):
            if i % 7 == 3:
                await p.append(sparse_bundle([p.high_water_mark + 3, p.high_water_mark + 5]))
            else:
                await p.append(bundle(i % 3 + 1, f"i{i}", size=20))
        return as_tuples(all_messages(p))


async def _check_every_seq(path: Path, expected: list) -> None:
    async with store_at(path, "os", index_interval_bytes=128) as store:
        p = store.partition("t", 0)
        for seq, *rest in expected:
            msgs, _ = read_messages(p, seq, 1)
            assert (msgs[0].seq, msgs[0].value) == (seq, rest[0])
        r = await p.append(bundle(1, "after"))
        assert r.first_seq == expected[-1][0] + 1


async def test_index_deleted_truncated_or_garbage(tmp_path):
    ref = tmp_path / "ref"
    expected = await _build_indexed(ref)
    good_index = _index(ref).read_bytes()
    assert len(good_index) >= 5 * 8
    rng = random.Random(7)
    variants = {"deleted": None, "garbage": rng.randbytes(len(good_index)),
                "zeros": bytes(len(good_index)),
                "shifted": good_index[:8] + bytes(b + 1 if i % 8 == 4 else b
                                                  for i, b in enumerate(good_index[8:])),
                "past_end": good_index + (9999).to_bytes(4, "little") + (1 << 20).to_bytes(
                    4, "little")}
    for cut in range(len(good_index)):
        variants[f"cut{cut}"] = good_index[:cut]
    for name, content in variants.items():
        work = tmp_path / name
        shutil.copytree(ref, work)
        if content is None:
            _index(work).unlink()
        else:
            _index(work).write_bytes(content)
        await _check_every_seq(work, expected)
        assert _index(work).read_bytes()[:len(good_index)] == good_index[
            :len(_index(work).read_bytes())], name
        shutil.rmtree(work)


async def test_rolled_segment_index_is_rebuilt_when_bad(tmp_path):
    async with store_at(tmp_path, segment_bytes=400, index_interval_bytes=128) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(60):
            await p.append(bundle(2, f"r{i}", size=10))
        expected = as_tuples(all_messages(p))
        rolled = [n for n in segment_names(p) if n.endswith(".ilog")]
    assert len(rolled) >= 3
    pdir = tmp_path / "t" / "0"
    first, second, third = (pdir / f"{n.split('-')[0]}.index" for n in rolled[:3])
    first.unlink()
    second.write_bytes(b"\xff" * 13)
    # structurally plausible but wrong: points into the middle of bundles
    third.write_bytes(b"".join(i.to_bytes(4, "little") * 2 for i in range(0, 40, 8))[:8]
                      + (3).to_bytes(4, "little") + (37).to_bytes(4, "little"))
    async with store_at(tmp_path, segment_bytes=400, index_interval_bytes=128) as store:
        p = store.partition("t", 0)
        for seq, *rest in expected:
            msgs, _ = read_messages(p, seq, 1)
            assert (msgs[0].seq, msgs[0].value) == (seq, rest[0])
    assert first.exists() and len(second.read_bytes()) % 8 == 0


@pytest.mark.parametrize("partial", [0, 5])
async def test_disk_full_leaves_nothing_visible(tmp_path, monkeypatch, partial):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2))
        size = p._active.size
        real = os.pwritev

        def full(fd, buffers, offset):
            if partial:
                os.pwrite(fd, b"".join(buffers)[:partial], offset)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwritev", full)
        with pytest.raises(StoreIOError):
            await p.append(bundle(3, "lost"))
        assert os.path.getsize(p._active.path) == size
        assert p.high_water_mark == 2
        monkeypatch.setattr(os, "pwritev", real)
        r = await p.append(bundle(1, "ok"))
        assert r.first_seq == 3
    async with store_at(tmp_path) as store:
        assert [m.value for m in all_messages(store.partition("t", 0))] == [b"m0", b"m1", b"ok0"]


async def test_failed_fsync_fails_the_waiting_appends_and_cuts_them(tmp_path, monkeypatch):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2))
        size = p._active.size
        with monkeypatch.context() as patch:
            fail_fsyncs(p, patch)
            with pytest.raises(StoreIOError):
                await p.append(bundle(3, "lost"))
        assert p.high_water_mark == 2
        assert os.path.getsize(p._active.path) == size
        r = await p.append(bundle(1, "ok"))
        assert (r.first_seq, r.last_seq) == (3, 3)
        assert [m.value for m in all_messages(p)] == [b"m0", b"m1", b"ok0"]


async def test_stray_and_unknown_files(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        await store.partition("t", 0).append(bundle(1))
    pdir = tmp_path / "t" / "0"
    (pdir / ".5.index.tmp").write_bytes(b"junk")
    (pdir / "notes.txt").write_text("hello")
    (tmp_path / ".half-created").mkdir()
    (tmp_path / ".half-created" / "0").mkdir()
    (tmp_path / ".cleanup.log").write_bytes(b"tank writes this one")
    (tmp_path / "bad name!").mkdir()
    async with store_at(tmp_path) as store:
        assert store.topics() == ["t"]
        assert store.partition("t", 0).high_water_mark == 1
    assert not (pdir / ".5.index.tmp").exists()
    assert (pdir / "notes.txt").exists()
    assert not (tmp_path / ".half-created").exists()
    assert (tmp_path / ".cleanup.log").exists()
