"""The fsync path: zeros written ahead of the active segment, both fsync workers, the tail
cache's byte budget."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

import gateway.store.syncer as syncer_module
from gateway.store.durability import SyncJob
from gateway.store.inspect import iter_messages, list_segments
from gateway.store.partition import PREFILL_AHEAD, PREFILL_LOW
from gateway.store.syncer import NativeSyncer, Syncer
from gateway.store.tail import TailCache, TailEntry, find
from protocols.native import pure_python_requested
from tests.store.helpers import NO_SUCH_FD, all_messages, as_tuples, bundle, segment_names, store_at


def active_segment(p) -> Path:
    [name] = [n for n in segment_names(p) if n.endswith(".log")]
    return Path(p.directory) / name


async def test_fsync_mode_keeps_zeros_ahead_of_the_data(tmp_path):
    async with store_at(tmp_path, "fsync") as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(20):
            await p.append(bundle(5, f"z{i}", size=100))
        path = active_segment(p)
        data_end = p.size_bytes
        zeros = path.stat().st_size - data_end
        assert PREFILL_LOW <= zeros <= PREFILL_AHEAD
        assert path.read_bytes()[data_end:] == bytes(zeros)
        # readers and tools see the data only
        assert len(all_messages(p)) == 100
        [segment] = list_segments(p.directory)
        assert [r.seq for r in iter_messages(p.directory, segment)] == list(range(1, 101))
        before = as_tuples(all_messages(p))
    assert path.stat().st_size == data_end  # closed: the file ends with its data (Tank's form)
    async with store_at(tmp_path, "fsync") as store:
        assert as_tuples(all_messages(store.partition("t", 0))) == before


async def test_os_mode_writes_no_zeros(tmp_path):
    async with store_at(tmp_path, "os") as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(5))
        assert active_segment(p).stat().st_size == p.size_bytes


async def test_zeros_left_by_a_crash_are_trimmed_quietly(tmp_path):
    async with store_at(tmp_path / "live", "fsync") as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(10):
            await p.append(bundle(3, f"c{i}"))
        expected = as_tuples(all_messages(p))
        # what a crash leaves: the files as they are while the store runs
        shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    with capture_logs() as logs:
        async with store_at(tmp_path / "crashed", "fsync") as store:
            assert as_tuples(all_messages(store.partition("t", 0))) == expected
    events = {entry["event"]: entry for entry in logs}
    assert PREFILL_LOW <= events["segment_prefill_trimmed"]["bytes"] <= PREFILL_AHEAD
    assert "segment_tail_truncated" not in events  # nothing of the data was lost


async def test_a_roll_cuts_the_zeros_of_the_rolled_segment(tmp_path):
    async with store_at(tmp_path, "fsync", segment_bytes=2000) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(30):
            await p.append(bundle(2, f"r{i}", size=60))
        rolled = [n for n in segment_names(p) if n.endswith(".ilog")]
        assert rolled
        for name in rolled:
            content = (Path(p.directory) / name).read_bytes()
            assert content and content[-1:] != b"\x00" and len(content) <= 2200


def syncers() -> list[type]:
    kinds: list[type] = [Syncer]
    if not pure_python_requested():
        assert syncer_module._native is not None, "gateway.store._fsync is not built"
        kinds.append(NativeSyncer)
    return kinds


def open_kind(kind: type, threads: int) -> Syncer | NativeSyncer:
    return Syncer(threads) if kind is Syncer else NativeSyncer(threads, syncer_module._native)


@pytest.mark.parametrize("kind", syncers())
async def test_syncer_reports_each_job_in_the_trio_thread(tmp_path, kind):
    files = [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT) for i in range(3)]
    syncer = open_kind(kind, threads=2)
    reports: list[tuple[int, OSError | None]] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(syncer.run)
            jobs = [SyncJob([os.dup(files[i % 3])], str(tmp_path) if i % 7 == 0 else None)
                    for i in range(150)]  # more than go to the workers at once
            jobs.append(SyncJob([NO_SUCH_FD]))
            for i, job in enumerate(jobs):
                syncer.submit(job, lambda error, seconds, i=i: reports.append((i, error)))
            with trio.fail_after(10):
                while len(reports) < len(jobs):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        syncer.close()
        for fd in files:
            os.close(fd)
    assert sorted(i for i, _ in reports) == list(range(len(jobs)))
    errors = {i: error for i, error in reports if error is not None}
    assert list(errors) == [len(jobs) - 1]
    assert errors[len(jobs) - 1].errno == errno.EBADF


def test_tail_cache_keeps_the_newest_bundles_of_all_partitions_within_its_budget():
    cache = TailCache(1000)
    a, b = cache.partition(), cache.partition()
    seq = {id(a): 1, id(b): 1}

    def add(tail, size: int) -> None:
        first = seq[id(tail)]
        tail.append(TailEntry(first, first + 1, False, "seg", 0), b"", bytes(size))
        seq[id(tail)] = first + 2

    def found(tail, at: int, visible: int, target: int = 1 << 20) -> list[int] | None:
        span = find(tail, at, target, visible)
        return None if span is None else [span.first.first_seq, span.last.first_seq,
                                          span.size]

    for _ in range(5):
        add(a, 150)
        add(b, 100)
    assert cache.size == 1250 - 250 and cache.size <= 1000
    assert a.first_seq == 3 and b.first_seq == 3  # each lost its oldest bundle
    assert found(a, 1, 100) is None  # gone: read from the file
    assert found(a, 4, 100) == [3, 9, 4 * 150]
    assert found(a, 4, 6) == [3, 5, 2 * 150]  # up to what is visible
    assert found(a, 4, 100, target=151) == [3, 5, 2 * 150]  # to the boundary past it
    add(a, 900)  # a big one pushes out the oldest, whoever's they are
    assert cache.size <= 1000 and a.first_seq == 11 and len(b) <= 1


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        assert exc.errno == errno.EBADF
        return False
    return True


@pytest.mark.parametrize("kind", syncers())
async def test_syncer_closes_the_descriptors_of_a_job_off_the_event_loop(tmp_path, kind):
    """A job owns its descriptors: the syncer's worker closes them once the job is done
    (before its report), failed syncs and directories included, and
    the job is left holding none, so the round's own ``close()`` can not close a descriptor
    that has since been reused."""
    target = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    syncer = open_kind(kind, threads=2)
    jobs = [SyncJob([os.dup(target), os.dup(target)], str(tmp_path) if i % 2 else None)
            for i in range(6)]
    jobs.append(SyncJob([os.dup(target), NO_SUCH_FD]))  # fails: still closed
    handed = [fd for job in jobs for fd in job.fds if fd != NO_SUCH_FD]
    reports: list[OSError | None] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(syncer.run)
            for job in jobs:
                syncer.submit(job, lambda error, seconds: reports.append(error))
            with trio.fail_after(10):
                while len(reports) < len(jobs) or any(_is_open(fd) for fd in handed):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        syncer.close()
    assert [r is None for r in reports].count(False) == 1
    assert all(job.fds == [] for job in jobs)
    reused = os.dup(target)  # may take the number of a descriptor the workers closed
    for job in jobs:
        job.close()
    assert _is_open(reused) and _is_open(target)
    os.close(reused)
    os.close(target)


@pytest.mark.parametrize("kind", syncers())
async def test_a_reported_job_holds_no_descriptor(tmp_path, kind):
    """By the time a job's report arrives its descriptors are closed: the store's
    descriptor bound counts none of a round that has been reported."""
    target = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    syncer = open_kind(kind, threads=2)
    open_at_report: list[list[int]] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(syncer.run)
            for i in range(8):  # one at a time: no descriptor is opened while one reports
                fds = [os.dup(target), os.dup(target)]
                reported = trio.Event()

                def report(error: OSError | None, seconds: float, fds: list[int] = fds,
                           reported: trio.Event = reported) -> None:
                    open_at_report.append([fd for fd in fds if _is_open(fd)])
                    reported.set()

                syncer.submit(SyncJob(list(fds), str(tmp_path) if i % 2 else None), report)
                with trio.fail_after(10):
                    await reported.wait()
            nursery.cancel_scope.cancel()
    finally:
        syncer.close()
        os.close(target)
    assert open_at_report == [[]] * 8
