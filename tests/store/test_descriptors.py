"""Segment descriptors (issue 15, item 1): one per segment file, shared by every read of it
and kept open by reference counting; rolled segments' files within a bound (LRU)."""

from __future__ import annotations

import os

from gateway.store import StoreSettings, TopicConfig, open_store
from gateway.store.files import OpenFiles, SegmentFile
from tests.store.helpers import all_messages, bundle, segment_names, store_at


def fds_under(directory: os.PathLike[str] | str) -> int:
    """Descriptors of this process open on files under ``directory`` (deleted ones too)."""
    prefix = os.path.realpath(directory) + os.sep
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(prefix):
            count += 1
    return count


def deleted_files_open(directory: os.PathLike[str] | str) -> int:
    """Descriptors of this process open on deleted files that were under ``directory``."""
    prefix = os.path.realpath(directory) + os.sep
    return sum(1 for name in os.listdir("/proc/self/fd")
               if _target(name).startswith(prefix) and _target(name).endswith(" (deleted)"))


def _target(fd_name: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd_name}")
    except OSError:
        return ""


def test_segment_file_closes_with_its_last_reference(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    file = SegmentFile(fd)
    assert file.acquire() is file and file.refs == 2
    file.release()
    assert file.fd == fd and os.fstat(fd)
    file.release()
    assert file.fd == -1 and file.refs == 0
    assert fds_under(tmp_path) == 0


def test_open_files_closes_the_least_recently_used():
    closed: list[str] = []

    class Seg:
        def __init__(self, name: str) -> None:
            self.name = name

        def drop_file(self) -> None:
            closed.append(self.name)

    hits: list[int] = []
    files = OpenFiles(2, on_evict=lambda: hits.append(1))
    a, b, c = Seg("a"), Seg("b"), Seg("c")
    files.touch(a)
    files.touch(b)
    files.touch(a)  # b is now the least recently used
    files.touch(c)
    assert closed == ["b"] and len(files) == 2 and files.evictions == 1 and hits == [1]
    files.forget(a)
    files.touch(b)
    assert closed == ["b"] and len(files) == 2


async def test_reads_share_one_descriptor_per_segment(tmp_path):
    async with store_at(tmp_path, segment_bytes=1 << 20) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(10):
            await p.append(bundle(5, f"b{i}"))
        before = fds_under(tmp_path)
        results = [p.read(1 + (i % 50), 64) for i in range(1000)]
        assert fds_under(tmp_path) == before  # today's code: one dup per read
        assert len({r.fileno() for r in results}) == 1
        expected = results[0].read_bytes()
        assert all(r.read_bytes() == expected for r in results[::50])
        for r in results:
            r.close()
        assert fds_under(tmp_path) == before


async def test_a_read_held_across_a_roll_and_retention_reads_right(tmp_path):
    async with store_at(tmp_path, segment_bytes=100, retention_segments=2) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(3, "first"))
        held = [p.read(1, 1000) for _ in range(3)]
        expected = held[0].read_bytes()
        await p.append(bundle(3, "second"))  # rolls the first segment
        assert any(n.startswith("1-") for n in segment_names(p))
        assert held[1].read_bytes() == expected
        for i in range(20):  # more rolls; retention deletes the first segment
            await p.append(bundle(3, f"more{i}"))
        assert not any(n.startswith(("1_", "1-")) for n in segment_names(p))
        source = held[2].sendfile_source()
        assert source is not None
        assert os.pread(source[0], held[2].length, source[1]) == expected
        assert all(r.read_bytes() == expected for r in held)
        # The deleted segment's file stays open for the reads, and only for them.
        assert deleted_files_open(tmp_path) == 1
        held[0].close()
        assert held[1].read_bytes() == expected
        for r in held:
            r.close()
        assert deleted_files_open(tmp_path) == 0


async def test_rolled_segment_files_stay_within_the_bound(tmp_path):
    settings = StoreSettings(topic_defaults=TopicConfig(segment_bytes=100),
                             maintenance_interval=float("inf"), tail_cache_bytes=0,
                             max_open_segments=4)
    async with open_store(tmp_path, settings, maintenance=False) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(60):
            await p.append(bundle(2, f"m{i}"))
        assert p.segment_count >= 20
        # The active segment and its index, plus at most 4 rolled segment files.
        assert fds_under(tmp_path) <= 2 + 4
        seen = all_messages(p, fetch_size=1)  # reads every old segment: reopened on demand
        assert [m.seq for m in seen] == list(range(1, 121))
        assert fds_under(tmp_path) <= 2 + 4
        assert len(store.open_files) == 4 and store.open_files.evictions > 10
    # Reopened: rolled segments open nothing until read.
    async with open_store(tmp_path, settings, maintenance=False) as store:
        p = store.partition("t", 0)
        assert fds_under(tmp_path) <= 2
        with p.read(1, 1) as r:
            assert r.length and fds_under(tmp_path) <= 3
        assert [m.seq for m in all_messages(p)] == list(range(1, 121))
        assert fds_under(tmp_path) <= 2 + 4


async def test_a_read_in_flight_keeps_its_file_when_the_bound_closes_it(tmp_path):
    settings = StoreSettings(topic_defaults=TopicConfig(segment_bytes=100),
                             maintenance_interval=float("inf"), tail_cache_bytes=0,
                             max_open_segments=1)
    async with open_store(tmp_path, settings, maintenance=False) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(20):
            await p.append(bundle(2, f"m{i}"))
        first = p.read(1, 1)
        expected = first.read_bytes()
        with p.read(20, 1) as other:  # another rolled segment: the first one's is closed
            assert other.length
        assert not p._segments[0].file_open
        assert first.read_bytes() == expected
        first.close()
