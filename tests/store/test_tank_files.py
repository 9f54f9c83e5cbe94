"""The store's files are Tank's: read them with an independent reader, and serve files we write.

The reader and writer here follow ``protocol-facts.md`` ("On-disk layout of the real
broker", "Bundles") and ``tank_encoding.md`` directly; they share no code with the
store or the protocol codec.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import snappy

from tests.store.helpers import all_messages, bundle, messages, sparse_bundle, store_at

# ------------------------------------------------------------------ independent reader


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def parse_bundle(data: bytes, next_seq: int) -> tuple[list[tuple[int, bytes, bytes | None, int]],
                                                        bool]:
    """Messages ``(seq, value, key, ts)`` of one bundle, and whether it was sparse."""
    flags = data[0]
    pos = 1
    assert not flags & 0x80
    count = (flags >> 2) & 0xF
    if count == 0:
        count, pos = varint(data, pos)
    sparse = bool(flags & 0x40)
    if sparse:
        first = struct.unpack_from("<Q", data, pos)[0]
        pos += 8
        last = first
        if count > 1:
            gap, pos = varint(data, pos)
            last = first + gap + 1
    body = data[pos:]
    if flags & 3 == 1:
        body = snappy.decompress(body)
    out = []
    pos = 0
    ts = 0
    seq = first if sparse else next_seq
    for i in range(count):
        mflags = body[pos]
        pos += 1
        if sparse and i > 0:
            if i == count - 1:
                seq = last
            elif mflags & 4:
                seq += 1
            else:
                delta, pos = varint(body, pos)
                seq += delta + 1
        if not mflags & 2:
            ts = struct.unpack_from("<Q", body, pos)[0]
            pos += 8
        key = None
        if mflags & 1:
            klen = body[pos]
            key = body[pos + 1:pos + 1 + klen]
            pos += 1 + klen
        vlen, pos = varint(body, pos)
        out.append((seq, body[pos:pos + vlen], key, ts))
        pos += vlen
        if not sparse:
            seq += 1
    assert pos == len(body)
    return out, sparse


def read_segment(path: Path, base: int) -> tuple[list, list[tuple[int, int, int]]]:
    """Messages of a segment file and its bundles as ``(offset, framed_len, first_seq)``."""
    data = path.read_bytes()
    pos = 0
    next_seq = base
    out = []
    bundles = []
    while pos < len(data):
        length, start = varint(data, pos)
        msgs, _ = parse_bundle(data[start:start + length], next_seq)
        bundles.append((pos, start + length - pos, msgs[0][0]))
        out += msgs
        next_seq = msgs[-1][0] + 1
        pos = start + length
    assert pos == len(data)
    return out, bundles


def read_partition(pdir: Path, interval: int = 4096, intervals: dict | None = None) -> list:
    """Every message of a partition directory, checking names and indexes against Tank's rules."""
    names = sorted(p.name for p in pdir.iterdir())
    segments = []
    for name in names:
        if m := re.fullmatch(r"(\d+)-(\d+)_(\d+)\.ilog", name):
            segments.append((int(m[1]), int(m[2]), name))
        elif m := re.fullmatch(r"(\d+)(?:_\d+)?\.log", name):
            segments.append((int(m[1]), None, name))
        else:
            assert re.fullmatch(r"\d+\.index|config", name), name
    segments.sort()
    assert [s[1] for s in segments[:-1]].count(None) == 0  # one active segment, the last
    out = []
    for base, last, name in segments:
        msgs, bundles = read_segment(pdir / name, base)
        assert msgs[0][0] == base
        if last is not None:
            assert msgs[-1][0] == last
        raw = (pdir / f"{base}.index").read_bytes()
        entries = list(struct.iter_unpack("<II", raw))
        expected = []
        since = None
        for offset, framed, first in bundles:
            if since is None or since > (intervals or {}).get(base, interval):
                expected.append((first - base, offset))
                since = 0
            since += framed
        assert entries == expected, name
        out += msgs
    return out


async def test_files_written_by_the_store_read_back_independently(tmp_path):
    async with store_at(tmp_path, segment_bytes=700, index_interval_bytes=128) as store:
        await store.create_topic("events", 2, "log.segment.bytes=700\n")
        p = store.partition("events", 1)
        for i in range(40):
            if i % 9 == 4:
                await p.append(sparse_bundle([p.high_water_mark + 2, p.high_water_mark + 4,
                                              p.high_water_mark + 5]))
            elif i % 9 == 7:
                await p.append(bundle(1, f"gap{i}"), base_seq=p.high_water_mark + 10)
            else:
                await p.append(bundle(i % 20 + 1, f"b{i}", size=i, codec=None))
        expected = [(m.seq, m.value, m.key, m.timestamp) for m in all_messages(p)]
        assert p.segment_count > 3
    assert (tmp_path / "events" / "config").read_text() == "log.segment.bytes=700\n"
    assert sorted(x.name for x in (tmp_path / "events").iterdir()) == ["0", "1", "config"]
    assert list((tmp_path / "events" / "0").iterdir()) == []
    assert read_partition(tmp_path / "events" / "1", 128) == expected


# ------------------------------------------------------------------ independent writer


def put_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_bundle(msgs: list[tuple[int, bytes, bytes | None, int]], *, sparse: bool = False,
                 snappy_codec: bool = False) -> bytes:
    count = len(msgs)
    flags = (1 if snappy_codec else 0) | (0x40 if sparse else 0)
    head = bytearray([flags | (count << 2 if count <= 15 else 0)])
    if count > 15:
        head += put_varint(count)
    if sparse:
        head += struct.pack("<Q", msgs[0][0])
        if count > 1:
            head += put_varint(msgs[-1][0] - msgs[0][0] - 1)
    body = bytearray()
    last_ts = None
    for i, (seq, value, key, ts) in enumerate(msgs):
        mflags = (1 if key is not None else 0) | (2 if ts == last_ts else 0)
        delta = b""
        if sparse and 0 < i < count - 1:
            if seq == msgs[i - 1][0] + 1:
                mflags |= 4
            else:
                delta = put_varint(seq - msgs[i - 1][0] - 1)
        body.append(mflags)
        body += delta
        if ts != last_ts:
            body += struct.pack("<Q", ts)
            last_ts = ts
        if key is not None:
            body += bytes([len(key)]) + key
        body += put_varint(len(value)) + value
    if snappy_codec:
        body = bytearray(snappy.compress(bytes(body)))
    return bytes(head + body)


def write_segment(path: Path, index_path: Path, bundles: list[tuple[int, bytes]],
                  base: int, interval: int = 4096) -> None:
    data = bytearray()
    index = bytearray()
    since = None
    for first, b in bundles:
        if since is None or since > interval:
            index += struct.pack("<II", first - base, len(data))
            since = 0
        framed = put_varint(len(b)) + b
        data += framed
        since += len(framed)
    path.write_bytes(bytes(data))
    index_path.write_bytes(bytes(index))


def msgs(first: int, n: int, tag: str, ts: int = 1_600_000_000_000) -> list:
    return [(first + i, f"{tag}{i}".encode() * (i + 1), b"key" if i == 1 else None,
             ts + (i // 2)) for i in range(n)]


async def test_files_written_here_are_opened_and_served(tmp_path):
    pdir = tmp_path / "legacy" / "0"
    pdir.mkdir(parents=True)
    (tmp_path / "legacy" / "config").write_text("log.retention.secs = 10years\n")
    seg1 = [(1, write_bundle(msgs(1, 3, "a"))),
            (4, write_bundle(msgs(4, 20, "b"), snappy_codec=True)),
            (30, write_bundle(msgs(30, 1, "c") + msgs(33, 1, "c") + msgs(40, 1, "c"),
                              sparse=True))]
    write_segment(pdir / "1-40_1600000000.ilog", pdir / "1.index", seg1, 1, interval=64)
    seg2 = [(41, write_bundle(msgs(41, 2, "d"))),
            (43, write_bundle(msgs(43, 2, "e"), sparse=True, snappy_codec=True)),
            (45, write_bundle(msgs(45, 1, "f")))]
    write_segment(pdir / "41.log", pdir / "41.index", seg2, 41)  # Tank's older name, no ts
    sparse_values = {30: b"c0", 33: b"c0", 40: b"c0"}
    async with store_at(tmp_path) as store:
        assert store.topics() == ["legacy"]
        assert store.topic("legacy").config.retention_secs == 10 * 365 * 86400
        p = store.partition("legacy", 0)
        assert (p.first_available, p.high_water_mark) == (1, 45)
        got = all_messages(p)
        expected = [*msgs(1, 3, "a"), *msgs(4, 20, "b"), *msgs(43, 2, "e"), *msgs(45, 1, "f")]
        by_seq = {m.seq: (m.value, m.key, m.timestamp) for m in got}
        for seq, value, key, ts in expected:
            assert by_seq[seq] == (value, key, ts)
        assert {s: by_seq[s][0] for s in sparse_values} == sparse_values
        assert [m.seq for m in got] == sorted(by_seq)
        assert len(got) == 3 + 20 + 3 + 2 + 2 + 1
        with p.read(31, 1) as r:  # in a sparse gap: served from the sparse bundle
            assert r.first_bundle_sparse and r.base_seq == 30
        r = await p.append(bundle(2, "new"))
        assert (r.first_seq, r.last_seq) == (46, 47)
    # and what we appended is again readable by the independent reader
    on_disk = read_partition(pdir, intervals={1: 64})
    assert [m[0] for m in on_disk][-3:] == [45, 46, 47]
    assert on_disk[-1][1] == messages(2, "new")[1].value
