"""Recovery of the active segment keeps what it cuts and says what was lost."""

from __future__ import annotations

import shutil
from pathlib import Path

from structlog.testing import capture_logs

from gateway.store.index import read_index_file
from tests.store.helpers import as_tuples, bundle, read_messages, store_at

TOPIC = {"index_interval_bytes": 256}


async def build(path: Path, appends: int = 100) -> list:
    """One partition, every message in its active segment."""
    async with store_at(path, "fsync", **TOPIC) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(appends):
            await p.append(bundle(3, f"a{i}", size=20))
        return as_tuples(all_messages(p))


def all_messages(p) -> list:
    out: list = []
    seq = 0
    while True:
        batch, seq = read_messages(p, seq, 1 << 20)
        if not batch:
            return out
        out += batch


def files(path: Path) -> tuple[Path, Path]:
    pdir = path / "t" / "0"
    (log,) = pdir.glob("*.log")
    return log, pdir / f"{log.name.split('_')[0]}.index"


def truncated(logs: list[dict]) -> dict:
    (event,) = [e for e in logs if e["event"] == "segment_tail_truncated"]
    return event


async def test_a_corrupt_length_in_the_middle_keeps_the_cut_tail_in_a_corrupt_file(tmp_path):
    expected = await build(tmp_path)
    log, index = files(tmp_path)
    data = log.read_bytes()
    rels, offsets, _ = read_index_file(str(index))
    middle = offsets[len(offsets) // 2]  # a bundle's length prefix, half-way through
    kept = [m for m in expected if m[0] <= rels[len(rels) // 2]]  # rel = seq - 1 (base 1)
    with open(log, "r+b") as f:
        f.seek(middle)
        f.write(b"\xff")  # the length varint now runs on into the bundle
    with capture_logs() as logs:
        async with store_at(tmp_path, "fsync", **TOPIC) as store:
            p = store.partition("t", 0)
            assert as_tuples(all_messages(p)) == kept
            r = await p.append(bundle(1, "next"))
            assert r.first_seq == kept[-1][0] + 1
    event = truncated(logs)
    copy = log.parent / (log.name + ".corrupt")
    assert event["corrupt_file"] == copy.name
    cut = data[middle:]
    assert copy.read_bytes() == b"\xff" + cut[1:]
    assert event["bytes_dropped"] == len(cut)
    assert (event["first_seq_lost"], event["last_seq_lost"]) == (kept[-1][0] + 1,
                                                                expected[-1][0])
    assert event["last_seq_exact"] is True  # walked from the index entry after the cut
    # the copy is known: a restart does not warn about it, and it is left alone
    with capture_logs() as logs:
        async with store_at(tmp_path, "fsync", **TOPIC) as store:
            assert store.partition("t", 0).high_water_mark == kept[-1][0] + 1
    assert not [e for e in logs if e["event"] in ("unexpected_file_ignored",
                                                  "segment_tail_truncated")]
    assert copy.read_bytes() == b"\xff" + cut[1:]


async def test_a_second_cut_of_the_same_segment_gets_its_own_copy(tmp_path):
    await build(tmp_path, 10)
    log, _ = files(tmp_path)
    for n, name in enumerate((log.name + ".corrupt", log.name + ".1.corrupt")):
        with open(log, "ab") as f:
            f.write(b"\x7f" + bytes([n + 1]) * 9)  # a torn bundle of 127 bytes
        with capture_logs() as logs:
            async with store_at(tmp_path, "fsync", **TOPIC):
                pass
        assert truncated(logs)["corrupt_file"] == name
        assert (log.parent / name).read_bytes() == b"\x7f" + bytes([n + 1]) * 9


async def test_an_active_segment_truncated_to_zero_says_what_its_index_held(tmp_path):
    expected = await build(tmp_path)
    log, index = files(tmp_path)
    rels, offsets, _ = read_index_file(str(index))
    log.write_bytes(b"")
    with capture_logs() as logs:
        async with store_at(tmp_path, "fsync", **TOPIC) as store:
            assert store.partition("t", 0).high_water_mark == 0
    event = truncated(logs)
    assert event["bytes_dropped"] == 0 and event["corrupt_file"] is None
    assert event["first_seq_lost"] == expected[0][0]
    assert event["last_seq_lost"] == 1 + rels[-1] and event["last_seq_exact"] is False
    assert event["indexed_bytes_missing"] == offsets[-1] + 1


async def test_zeros_after_a_torn_bundle_are_not_kept_as_lost_data(tmp_path):
    """What a crash in fsync mode leaves: a bundle half written into the zeros ahead."""
    async with store_at(tmp_path, "fsync", **TOPIC) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2, "x"))
        good = p._active.size
        log, _ = files(tmp_path)
        torn = bundle(3, "torn", size=50)
        with open(log, "r+b") as f:  # the store runs: the file ends in zeros written ahead
            f.seek(good)
            f.write(bytes([len(torn)]) + torn[:20])
        zeros_after = log.stat().st_size - good - 21
        assert zeros_after > 0
        shutil.copytree(tmp_path / "t", tmp_path / "crashed" / "t")
    with capture_logs() as logs:
        async with store_at(tmp_path / "crashed", "fsync", **TOPIC) as store:
            assert store.partition("t", 0).high_water_mark == 2
    event = truncated(logs)
    assert event["bytes_dropped"] == 21 and event["first_seq_lost"] == 3
    crashed_log = tmp_path / "crashed" / "t" / "0" / log.name
    assert (crashed_log.parent / (log.name + ".corrupt")).read_bytes() == (
        bytes([len(torn)]) + torn[:20])
    assert next(e for e in logs if e["event"] == "segment_prefill_trimmed")["bytes"] == (
        zeros_after)
