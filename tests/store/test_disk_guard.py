"""The store's disk guard (:mod:`gateway.store.disk`) on real filesystems: the floor of
free space (capped for small disks) refuses appends as ``DiskFull`` before the filesystem
does and leaves nothing visible; a full filesystem's own ENOSPC is a ``no_space`` fault; a
failed fsync stands until an fsync succeeds; the zeros written ahead are counted exactly
through appends, rolls and closes, within their bound."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.store import NO_BOUNDS, DiskFull, StoreIOError, StoreSettings, TopicConfig, open_store
from gateway.store.disk import PREFILL_MIN_HEADROOM
from tests.disks import fill, free_bytes, tmpfs
from tests.store.helpers import all_messages, bundle, fail_fsyncs

MIB = 1024 * 1024


def _settings(**kw: object) -> StoreSettings:
    return StoreSettings(maintenance_interval=float("inf"), disk_check_interval=float("inf"),
                         config_bounds=NO_BOUNDS, **kw)  # type: ignore[arg-type]


def _held_zeros(store: object) -> int:
    return sum(p._active.prefilled - p._active.size  # type: ignore[attr-defined]
               for name in store.topics()  # type: ignore[attr-defined]
               for p in store.topic(name).partitions  # type: ignore[attr-defined]
               if p._active is not None and p._active.file_open)


@pytest.mark.parametrize(("percent", "floor"), [(5.0, int(8 * MIB * 5 / 100)), (50.0, MIB)])
async def test_the_floor_refuses_before_the_filesystem_and_lets_go_when_space_returns(
        tmp_path: Path, percent: float, floor: int) -> None:
    failures: list[str] = []
    with tmpfs(tmp_path / "disk", 8 * MIB) as disk:
        async with open_store(disk / "data", _settings(min_free_bytes=MIB,
                                                       min_free_percent=percent),
                              on_write_failure=failures.append) as store:
            assert store.disk.floor == floor  # the smaller of the bytes and the share
            await store.create_topic("t", 1)
            p = store.partition("t", 0)
            await p.append(bundle(2))
            filler = fill(disk / "filler", leave=floor + 8192)
            store.disk.look()
            before = os.path.getsize(p._active.path)
            with pytest.raises(DiskFull) as refused:
                await p.append(bundle(1, "big", size=64 * 1024))
            assert refused.value.kind == "no_space"
            assert "disk full" in str(refused.value) and "store.min_free_bytes" in str(
                refused.value)
            assert free_bytes(disk) > floor  # refused before the filesystem would
            assert (p.high_water_mark, os.path.getsize(p._active.path)) == (2, before)
            assert store.not_writable() is not None and failures == ["below_floor"]
            filler.unlink()
            store.disk.look()
            assert store.not_writable() is None
            assert (await p.append(bundle(1, "after"))).first_seq == 3
        async with open_store(disk / "data", _settings()) as store:
            assert [m.value for m in all_messages(store.partition("t", 0))] == [
                b"m0", b"m1", b"after0"]


async def test_one_write_too_big_for_what_is_left_does_not_make_the_store_unwritable(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", 8 * MIB) as disk:
        async with open_store(disk / "data", _settings()) as store:
            await store.create_topic("t", 1)
            p = store.partition("t", 0)
            with pytest.raises(DiskFull):
                await p.append(bundle(1, "huge", size=int(7.9 * MIB)))
            assert store.not_writable() is None
            assert (await p.append(bundle(1, "small"))).first_seq == 1


async def test_without_a_floor_the_filesystems_enospc_is_a_no_space_fault(tmp_path: Path
                                                                           ) -> None:
    failures: list[str] = []
    with tmpfs(tmp_path / "disk", 4 * MIB) as disk:
        async with open_store(disk / "data", _settings(min_free_bytes=0, durability="os"),
                              on_write_failure=failures.append) as store:
            await store.create_topic("t", 1)
            p = store.partition("t", 0)
            await p.append(bundle(1))
            filler = fill(disk / "filler", leave=0)
            with pytest.raises(StoreIOError) as failed:
                await p.append(bundle(1, "big", size=256 * 1024))
            assert not isinstance(failed.value, DiskFull)
            assert failed.value.kind == "no_space" and "disk full" in str(failed.value)
            assert failures == ["no_space"] and p.high_water_mark == 1
            assert (store.not_writable() or "").startswith("disk full")
            filler.unlink()
            assert (await p.append(bundle(1, "after"))).first_seq == 2
            assert store.not_writable() is None  # a write went well: the fault is over


async def test_a_failed_fsync_stands_until_an_fsync_succeeds(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    failures: list[str] = []
    async with open_store(tmp_path, _settings(), on_write_failure=failures.append) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(1))
        with monkeypatch.context() as patch:
            fail_fsyncs(p, patch)
            with pytest.raises(StoreIOError) as failed:
                await p.append(bundle(1, "lost"))
            assert failed.value.kind == "io_error"
            assert failures == ["fsync"]
            assert "fsync" in (store.not_writable() or "")
        assert store.disk.needs_probe
        assert (await p.append(bundle(1, "ok"))).first_seq == 2
        assert store.not_writable() is None


async def test_zeros_ahead_are_counted_exactly_and_bounded(tmp_path: Path) -> None:
    assert free_bytes(tmp_path) > PREFILL_MIN_HEADROOM * 2, "the test needs a roomy disk"
    settings = _settings(max_prefill_bytes=6 * MIB, min_free_bytes=0,
                         topic_defaults=TopicConfig(segment_bytes=3 * MIB))
    async with open_store(tmp_path, settings) as store:
        await store.create_topic("t", 3)
        parts = [store.partition("t", i) for i in range(3)]
        for p in parts:
            await p.append(bundle(1, size=1000))
        # Up to the roll size (3 MiB) for two, and the bound leaves the third none.
        assert 6 * MIB - 4096 < store.disk.prefill_bytes == _held_zeros(store) <= 6 * MIB
        assert parts[2]._active.prefilled == parts[2]._active.size
        for _ in range(40):  # past a roll: the rolled segment's zeros are cut off
            await parts[0].append(bundle(1, "r", size=100_000))
        assert parts[0].segment_count == 2
        assert store.disk.prefill_bytes == _held_zeros(store) <= 6 * MIB
        assert store._hand_back_zeros() > 0
        assert store.disk.prefill_bytes == _held_zeros(store) == 0
    assert store.disk.prefill_bytes == 0
