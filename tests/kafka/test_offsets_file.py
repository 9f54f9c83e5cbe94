"""The committed offsets' file: group commit, a torn tail cut off at recovery, compaction
by rename, and commits acknowledged before a SIGKILL of ``figtank serve`` found after."""

from __future__ import annotations

import os
import signal
import socket
import struct

import pytest
import trio
from structlog.testing import capture_logs

from gateway.kafka.groups.offsets import (
    COMPACTING,
    FILE_NAME,
    MAGIC,
    OffsetFileError,
    OffsetLimits,
    open_offset_store,
    recover,
)
from protocols.kafka.messages import RESPONSES
from protocols.kafka.records import read_response_header
from protocols.kafka.types import ApiKey
from tests.kafka.raw import request
from tests.kafka.test_commits import _commit_body
from tests.serving import figtank_serve


async def test_concurrent_commits_share_writes_and_read_back(tmp_path):
    path = tmp_path / FILE_NAME
    async with open_offset_store(path, fsync=True) as store:
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(store.commit, f"g{i % 5}", [("t", i, i * 10, None)])
        size = store.file_bytes
    async with open_offset_store(path) as again:
        assert again.groups() == [f"g{i}" for i in range(5)]
        assert again.get("g3", "t", 13).offset == 130
        assert again.entries == 50 and again.file_bytes == size


async def test_a_torn_tail_is_dropped_with_a_log_line(tmp_path):
    path = tmp_path / FILE_NAME
    async with open_offset_store(path) as store:
        await store.commit("g", [("t", 0, 5, "kept")])
        whole = store.file_bytes
        await store.commit("g", [("t", 0, 9, "torn")])
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # the last record half-written
    with capture_logs() as logs:
        async with open_offset_store(path) as store:
            assert store.get("g", "t", 0).offset == 5
            await store.commit("g", [("t", 1, 1, None)])  # appended after the cut
    torn = [e for e in logs if e["event"] == "offsets_torn_tail_dropped"]
    assert len(torn) == 1 and torn[0]["kept_bytes"] == whole
    async with open_offset_store(path) as store:
        assert store.committed("g")[("t", 1)].offset == 1
    # A damaged record (bad checksum) ends the file the same way.
    data = bytearray(path.read_bytes())
    data[len(MAGIC) + 9] ^= 0xFF
    path.write_bytes(bytes(data))
    async with open_offset_store(path) as store:
        assert store.groups() == []
        assert path.read_bytes() == MAGIC


async def test_a_file_that_is_not_ours_is_refused(tmp_path):
    path = tmp_path / FILE_NAME
    path.write_bytes(b"something else entirely")
    with pytest.raises(OffsetFileError, match="not a figtank offsets file"):
        async with open_offset_store(path):
            pass


async def test_the_file_is_compacted_by_rename(tmp_path):
    path = tmp_path / FILE_NAME
    limits = OffsetLimits(compact_bytes=4096)
    async with open_offset_store(path, limits=limits) as store:
        for i in range(500):
            await store.commit("g", [("t", i % 3, i, "m" * 20)])
        assert store.compactions >= 5
        assert store.file_bytes <= 4096 + 200
    assert path.stat().st_size <= 4096 + 200
    assert not path.with_name(FILE_NAME + COMPACTING).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]
    async with open_offset_store(path) as store:
        assert {k: c.offset for k, c in store.committed("g").items()} == {
            ("t", 0): 498, ("t", 1): 499, ("t", 2): 497}


def _commit_raw(address: tuple[str, int], group: str, offset: int) -> int:
    """One OffsetCommit over a blocking socket; its error code once answered."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(request(ApiKey.OFFSET_COMMIT, 8, 1,
                             _commit_body(group, [("t", 0, offset, None)])))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            data += chunk
    payload = data[4:]
    _, pos = read_response_header(payload, 0, len(payload), 1)
    body = RESPONSES[ApiKey.OFFSET_COMMIT].decode(payload[pos:], version=8)
    return body.topics[0].partitions[0].error_code


def test_commits_survive_sigkill_of_figtank_serve_in_fsync_mode(tmp_path):
    data = tmp_path / "data"
    (data / "t" / "0").mkdir(parents=True)  # a topic of one partition, Tank's layout
    args = ("--data-dir", str(data), "--durability", "fsync", "--kafka-listen",
            "127.0.0.1:0", "--tank-listen", "", "--figg-listen", "",
            "--metrics-listen", "")
    with figtank_serve(*args) as served:
        kafka = _kafka_address(served.log_lines)
        codes = [_commit_raw(kafka, f"g{i}", 100 + i) for i in range(20)]
        served.process.send_signal(signal.SIGKILL)  # right after the last answer
        served.process.wait()
    assert codes == [0] * 20
    with figtank_serve(*args) as served:
        loaded = served.events("offsets_loaded")
        served.stop()
    assert loaded and loaded[0]["entries"] == 20 and loaded[0]["groups"] == 20
    state, _ = recover(data / FILE_NAME)
    assert {g: o[("t", 0)].offset for g, o in state.items()} == {
        f"g{i}": 100 + i for i in range(20)}


def _kafka_address(lines: list[dict]) -> tuple[str, int]:
    serving = next(line for line in lines if line.get("event") == "figtank_serving")
    host, _, port = serving["kafka"].rpartition(":")
    return host, int(port)



async def test_commits_after_a_compaction_whose_directory_fsync_failed_are_kept(
        tmp_path, monkeypatch):
    # The rename is done when the directory's fsync fails (injected: a real disk does
    # not fail on demand): later appends must go to the file now at the log's name, not
    # to the replaced one, and the directory is fsynced before they are acknowledged.
    import gateway.kafka.groups.offsets as offsets_module
    path = tmp_path / FILE_NAME
    real = offsets_module.sync_directory
    calls = {"failing": True, "failed": 0, "after": 0}

    def flaky(directory):
        if calls["failing"]:
            calls["failed"] += 1
            raise OSError(5, "Input/output error")
        if calls["failed"]:
            calls["after"] += 1
        real(directory)

    limits = OffsetLimits(compact_bytes=4096)
    async with open_offset_store(path, limits=limits) as store:
        monkeypatch.setattr(offsets_module, "sync_directory", flaky)
        i = acked = 0
        while not calls["failed"]:
            if await store.commit("g", [("t", i % 3, i, "m" * 20)]) == [0]:
                acked = i
            i += 1
        await trio.sleep(0.2)  # the failed compaction's worker thread is done
        # What a SIGKILL now would leave: the appends go to the file at the log's name.
        assert os.fstat(store._fd).st_ino == path.stat().st_ino
        calls["failing"] = False
        codes = await store.commit("g", [("t", 7, 1234, None)])
        assert codes == [0]
        assert calls["after"] >= 1  # the directory was fsynced before an answer
    monkeypatch.setattr(offsets_module, "sync_directory", real)
    async with open_offset_store(path) as again:
        assert again.get("g", "t", 7).offset == 1234
        assert again.get("g", "t", acked % 3).offset == acked
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]


async def test_a_failed_compaction_leaves_no_file_behind_and_is_not_retried_at_once(
        tmp_path, monkeypatch):
    # The compacted copy can not be written (injected ENOSPC): the log is kept, the
    # partial copy removed, and the next batches do not each rewrite the file again.
    import gateway.kafka.groups.offsets as offsets_module
    path = tmp_path / FILE_NAME
    tries = []
    real_replace = offsets_module.os.replace

    def full(src, dst):
        tries.append(src)
        raise OSError(28, "No space left on device")

    limits = OffsetLimits(compact_bytes=4096)
    with capture_logs() as logs:
        async with open_offset_store(path, limits=limits) as store:
            monkeypatch.setattr(offsets_module.os, "replace", full)
            for i in range(300):
                assert await store.commit("g", [("t", i % 3, i, "m" * 20)]) == [0]
            assert store.compactions == 0
            monkeypatch.setattr(offsets_module.os, "replace", real_replace)
    assert len(tries) == 1
    assert len([e for e in logs if e["event"] == "offsets_compaction_failed"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]
    async with open_offset_store(path) as again:
        assert again.get("g", "t", 2).offset == 299
