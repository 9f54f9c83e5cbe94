"""Damage in rolled segments: found on first read (or at open), reported once, skipped."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.store import SegmentCheckPending, StoreSettings, TopicConfig, open_store
from gateway.store.damage import check_segment_file
from gateway.store.index import read_index_file
from protocols.tank.bundle import decode_chunk
from tests.store.helpers import as_tuples, bundle, read_messages, segment_names, store_at

TOPIC = {"segment_bytes": 400, "index_interval_bytes": 128}


async def build(path: Path, appends: int = 60) -> tuple[list, list[str]]:
    """A partition of many small rolled segments; returns its messages and segment names."""
    async with store_at(path, "os", **TOPIC) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(appends):
            await p.append(bundle(2, f"r{i}", size=10))
        return as_tuples(all_of(p)), segment_names(p)


def all_of(p: Any, fetch_size: int = 1) -> list:
    """Every message read chunk by chunk from the start (small chunks: many reads)."""
    out: list = []
    seq = 0
    while True:
        batch, seq = read_messages(p, seq, fetch_size)
        if not batch:
            return out
        out += batch


def rolled(path: Path, names: list[str]) -> list[Path]:
    return [path / "t" / "0" / n for n in names if n.endswith(".ilog")]


def seq_range(name: str) -> tuple[int, int]:
    first, last = name.split("_")[0].split("-")
    return int(first), int(last)


class Losses:
    """The store's data-loss callback: what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, messages: int, size: int) -> None:
        self.calls.append((messages, size))


def open_with(path: Path, losses: Losses | None = None, **settings: Any) -> Any:
    return open_store(path, StoreSettings(durability="os", topic_defaults=TopicConfig(**TOPIC),
                                          maintenance_interval=float("inf"),
                                          tail_cache_bytes=0, **settings),
                      maintenance=False, on_data_loss=losses)


def data_loss(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "data_loss"]


async def test_a_truncated_rolled_segment_is_skipped_and_later_segments_stay_readable(
        tmp_path):
    expected, names = await build(tmp_path)
    files = rolled(tmp_path, names)
    assert len(files) >= 4
    victim = files[1]
    first, last = seq_range(victim.name)
    data = victim.read_bytes()
    with open(victim, "r+b") as f:
        f.truncate(len(data) // 2 + 7)  # inside a bundle
    losses = Losses()
    with capture_logs() as logs:
        async with open_with(tmp_path, losses) as store:
            p = store.partition("t", 0)
            got = as_tuples(all_of(p))
            # every sequence of the lost range reads on from the next readable one
            lost = [seq for seq, *_ in expected if seq not in {g[0] for g in got}]
            for seq in lost:
                msgs, _ = read_messages(p, seq, 1)
                assert msgs[0].seq == last + 1
            assert p.damage and p.damage[0][0] == victim.name
    kept = {g[0] for g in got}
    assert got == [e for e in expected if e[0] in kept]
    assert lost == list(range(lost[0], last + 1)) and first < lost[0]
    assert got[-1] == expected[-1]  # the later segments are reachable
    (event,) = data_loss(logs)  # reported once, however often the range was read
    assert (event["segment"], event["first_seq"], event["last_seq"]) == (
        victim.name, lost[0], last)
    assert event["messages"] == len(lost) and 0 < event["bytes"] < len(data) // 2
    assert losses.calls == [(len(lost), event["bytes"])]


async def test_garbage_appended_to_a_rolled_segment_is_never_served(tmp_path):
    expected, names = await build(tmp_path)
    victim = rolled(tmp_path, names)[2]
    size = victim.stat().st_size
    garbage = b"\x63" + random.Random(3).randbytes(99)  # frames as one 99-byte bundle
    with open(victim, "ab") as f:
        f.write(garbage)
    with capture_logs() as logs:
        async with open_with(tmp_path) as store:
            p = store.partition("t", 0)
            assert as_tuples(all_of(p)) == expected
            assert as_tuples(all_of(p, 1 << 20)) == expected
            first, last = seq_range(victim.name)
            for seq in range(first, last + 1):  # no read of the segment reaches the garbage
                with p.read(seq, 1 << 20) as result:
                    assert result.offset + result.length <= size
                    assert garbage[:16] not in result.read_bytes()
    (event,) = data_loss(logs)
    assert (event["first_seq"], event["last_seq"], event["messages"]) == (None, None, 0)
    assert (event["offset"], event["bytes"]) == (size, 100)


async def test_damage_in_the_middle_resyncs_at_the_next_index_entry(tmp_path):
    expected, names = await build(tmp_path)
    victim = rolled(tmp_path, names)[1]
    rels, offsets, _ = read_index_file(str(victim.parent / f"{victim.name.split('-')[0]}.index"))
    assert len(offsets) >= 3
    base, last = seq_range(victim.name)
    with open(victim, "r+b") as f:  # a zeroed block over the second indexed bundle
        f.seek(offsets[1])
        f.write(bytes(offsets[2] - offsets[1]))
    async with open_with(tmp_path) as store:
        p = store.partition("t", 0)
        got = as_tuples(all_of(p))
        (_, damage), = p.damage
    lost = set(range(base + rels[1], base + rels[2]))
    assert (damage.first_lost, damage.last_lost) == (min(lost), max(lost))
    assert (damage.offset, damage.end) == (offsets[1], offsets[2])
    assert got == [e for e in expected if e[0] not in lost]
    assert any(base + rels[2] <= seq <= last for seq, *_ in got)  # the rest of the segment


async def test_a_check_of_the_segment_file_sees_every_kind_of_damage(tmp_path):
    _, names = await build(tmp_path)
    victim = rolled(tmp_path, names)[0]
    base, last = seq_range(victim.name)
    data = victim.read_bytes()
    none: Any = read_index_file("/nonexistent")[:2]

    def check(content: bytes) -> Any:
        victim.write_bytes(content)
        return check_segment_file(str(victim), base, last, index_rels=none[0],
                                  index_offsets=none[1])

    assert check(data).clean
    for cut in range(1, len(data)):  # cut anywhere: the lost range runs to `last`
        result = check(data[:cut])
        (damage,) = result.damage
        assert damage.last_lost == last, cut
        assert damage.first_lost == (result.extents[-1].last_seq + 1 if result.extents
                                     else base)
    found = 0
    for i in range(len(data)):  # a flipped byte: what stays readable decodes as it says
        flipped = bytes(data[:i]) + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        result = check(flipped)
        found += not result.clean
        for extent in result.extents:
            msgs = decode_chunk(flipped[extent.start:extent.end], extent.first_seq).messages
            assert (msgs[0].seq, msgs[-1].seq) == (extent.first_seq, extent.last_seq), i
            assert extent.last_seq <= last
    assert found >= 2 * (last - base + 1) // 2  # at least each bundle's length and flags


async def test_startup_mode_finds_the_damage_while_opening(tmp_path):
    _, names = await build(tmp_path)
    victim = rolled(tmp_path, names)[3]
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size - 5)
    with capture_logs() as logs:
        async with open_with(tmp_path, check_rolled_segments="startup") as store:
            found = data_loss(logs)  # before anything was read
            assert [e["segment"] for e in found] == [victim.name]
            assert store.partition("t", 0).damage
    with capture_logs() as logs:
        async with open_with(tmp_path) as store:  # lazy (the default): nothing until read
            assert not data_loss(logs)
            read_messages(store.partition("t", 0), seq_range(victim.name)[0], 1)
            assert data_loss(logs)


async def test_a_big_segment_is_checked_in_a_worker_thread(tmp_path):
    expected, _names = await build(tmp_path)
    async with open_with(tmp_path, inline_check_bytes=0) as store:
        p = store.partition("t", 0)
        with pytest.raises(SegmentCheckPending):
            p.read(1, 100)
        await p.wait_checks()
        msgs, _ = read_messages(p, 1, 100)
        assert as_tuples(msgs) == expected[:len(msgs)]
        seq = 0
        got: list = []
        while True:  # every later segment: pending once, then readable
            try:
                batch, seq = read_messages(p, seq, 1 << 20)
            except SegmentCheckPending:
                await p.wait_checks()
                continue
            if not batch:
                break
            got += batch
        assert as_tuples(got) == expected


async def test_when_the_last_segment_is_damaged_readers_wait_for_new_appends(tmp_path):
    _expected, names = await build(tmp_path)
    pdir = tmp_path / "t" / "0"
    active = names[-1]
    assert active.endswith(".log")
    (pdir / active).unlink()  # a directory whose newest segment is a rolled one
    (pdir / f"{active.split('_')[0]}.index").unlink()
    victim = rolled(tmp_path, names)[-1]
    base, last = seq_range(victim.name)
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    async with open_with(tmp_path) as store:
        p = store.partition("t", 0)
        assert p.high_water_mark == last
        got = as_tuples(all_of(p))
        lost_from = got[-1][0] + 1
        assert base <= lost_from <= last
        with p.read(lost_from, 100) as result:
            assert result.at_tail and result.high_water_mark == last
        appended = await p.append(bundle(1, "after"))
        assert appended.first_seq == last + 1
        msgs, _ = read_messages(p, lost_from, 100)
        assert [(m.seq, m.value) for m in msgs] == [(last + 1, b"after0")]
