"""Property test: random appends, reads, rolls and reopens against an in-memory model."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.store import InvalidSequence, OutOfRange
from protocols.tank.bundle import Codec, Message, decode_chunk, encode_bundle
from protocols.wire import UINT64_MAX
from tests.store.helpers import read_messages, segment_names, store_at

ROLL_SECS = 100

values = st.binary(min_size=0, max_size=40)
keys = st.none() | st.binary(min_size=0, max_size=4)
codecs = st.sampled_from([Codec.NONE, Codec.SNAPPY])

ops = st.one_of(
    st.tuples(st.just("append"), st.lists(st.tuples(values, keys), min_size=1, max_size=20),
              codecs),
    st.tuples(st.just("sparse"), st.integers(0, 5),
              st.lists(st.integers(0, 3), min_size=0, max_size=6), codecs),
    st.tuples(st.just("base"), st.integers(0, 4), st.integers(1, 4), codecs),
    st.tuples(st.just("stale"), st.integers(0, 3)),
    st.tuples(st.just("read"), st.integers(-2, 60), st.integers(0, 400)),
    st.tuples(st.just("roll")),
    st.tuples(st.just("reopen")),
)


@dataclass
class Model:
    #: bundles as (first_seq, last_seq, [(seq, value, key, ts)])
    bundles: list = field(default_factory=list)

    @property
    def hwm(self) -> int:
        return self.bundles[-1][1] if self.bundles else 0

    @property
    def first(self) -> int:
        return self.bundles[0][0] if self.bundles else 0

    def messages(self) -> list:
        return [m for b in self.bundles for m in b[2]]


class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def as_rows(msgs: list[Message]) -> list:
    return [(m.seq, m.value, m.key, m.timestamp) for m in msgs]


def segment_size(p, seq: int) -> int:
    """Size of the segment file holding ``seq`` (the one with the greatest base <= seq)."""
    bases = {int(name.split("_")[0].split("-")[0]): name for name in segment_names(p)}
    return os.stat(os.path.join(p.directory, bases[max(b for b in bases if b <= seq)])).st_size


def check_read(p, model: Model, seq: int, fetch_size: int) -> None:
    hwm, first = model.hwm, model.first
    assert (p.high_water_mark, p.first_available) == (hwm, first)
    if seq == 0:
        target = first if first else hwm + 1
    elif seq == UINT64_MAX:
        target = hwm + 1
    else:
        target = seq
    if target > hwm + 1 or (seq != 0 and target < first):
        with pytest.raises(OutOfRange):
            p.read(seq, fetch_size)
        return
    with p.read(seq, fetch_size) as r:
        assert r.seq == target
        if target == hwm + 1:
            assert r.at_tail and r.next_seq == target
            return
        data = r.read_bytes()
        base = None if r.first_bundle_sparse else r.base_seq
        segment_end = segment_size(p, r.base_seq)
    chunk = decode_chunk(data, base)
    assert chunk.partial_bundle_len is None and chunk.consumed == len(data)
    start = next(i for i, b in enumerate(model.bundles) if b[1] >= target)
    assert r.base_seq == model.bundles[start][0]
    expected = [m for b in model.bundles[start:] for m in b[2]]
    got = as_rows(chunk.messages)
    assert got and got == expected[:len(got)]
    assert r.next_seq == got[-1][0] + 1
    # at least fetch_size bytes unless the segment (or the log) ended first
    if len(data) < max(fetch_size, 32):
        assert len(got) == len(expected) or r.offset + r.length == segment_end


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["fsync", "os"]), program=st.lists(ops, min_size=5, max_size=60),
       tail_cache=st.sampled_from([0, 200, 1 << 20]))
async def test_random_programs_match_the_model(mode, program, tail_cache):
    clock = Clock()
    model = Model()
    ts = 1_000
    kw = {"segment_bytes": 300, "index_interval_bytes": 128, "roll_secs": ROLL_SECS}
    with tempfile.TemporaryDirectory() as path:
        store_cm = store_at(path, mode, clock=clock, tail_cache_bytes=tail_cache, **kw)
        store = await store_cm.__aenter__()
        try:
            await store.create_topic("t", 1)
            for op in program:
                p = store.partition("t", 0)
                kind = op[0]
                if kind == "append":
                    ts += 1
                    msgs = [Message(v, k, ts) for v, k in op[1]]
                    r = await p.append(encode_bundle(msgs, codec=op[2]))
                    first = model.hwm + 1
                    assert (r.first_seq, r.last_seq) == (first, first + len(msgs) - 1)
                    model.bundles.append((first, r.last_seq, [
                        (first + i, m.value, m.key, m.timestamp) for i, m in enumerate(msgs)]))
                elif kind == "sparse":
                    seqs = [model.hwm + 1 + op[1]]
                    for gap in op[2]:
                        seqs.append(seqs[-1] + 1 + gap)
                    msgs = [Message(b"s%d" % s, None, ts, s) for s in seqs]
                    r = await p.append(encode_bundle(msgs, codec=op[3], sparse=True))
                    assert (r.first_seq, r.last_seq) == (seqs[0], seqs[-1])
                    model.bundles.append((seqs[0], seqs[-1],
                                          [(s, b"s%d" % s, None, ts) for s in seqs]))
                elif kind == "base":
                    first = model.hwm + 1 + op[1]
                    msgs = [Message(b"b%d" % (first + i), b"k", ts) for i in range(op[2])]
                    r = await p.append(encode_bundle(msgs, codec=op[3]), base_seq=first)
                    assert (r.first_seq, r.last_seq) == (first, first + op[2] - 1)
                    model.bundles.append((first, r.last_seq, [
                        (first + i, m.value, m.key, m.timestamp) for i, m in enumerate(msgs)]))
                elif kind == "stale":
                    if model.hwm:
                        seq = max(1, model.hwm - op[1])
                        with pytest.raises(InvalidSequence):
                            await p.append(encode_bundle([Message(b"x")]), base_seq=seq)
                        with pytest.raises(InvalidSequence):
                            await p.append(encode_bundle([Message(b"x", seq=seq)], sparse=True))
                elif kind == "read":
                    seq = {-2: UINT64_MAX, -1: 0}.get(op[1], op[1])
                    check_read(p, model, seq, op[2])
                elif kind == "roll":
                    clock.now += ROLL_SECS + 1
                    await store.maintain()
                else:
                    await store_cm.__aexit__(None, None, None)
                    store_cm = store_at(path, mode, clock=clock, tail_cache_bytes=tail_cache, **kw)
                    store = await store_cm.__aenter__()
            p = store.partition("t", 0)
            assert (p.high_water_mark, p.first_available) == (model.hwm, model.first)
            got = []
            seq = 0
            while True:
                batch, seq = read_messages(p, seq, 1 + len(got) % 200)
                if not batch:
                    break
                got += as_rows(batch)
            assert got == model.messages()
        finally:
            await store_cm.__aexit__(None, None, None)
