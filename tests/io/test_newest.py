"""The newest bundles of a partition (:mod:`gateway.io.newest`), the one structure of the
store's tail cache and the upstream feeds' caches: its lookups against a plain walk over
the bundles (what both caches did before), and the two budgets."""

from __future__ import annotations

import gc
import random
import weakref
from dataclasses import dataclass

import pytest

from gateway.io.newest import NewestBundles, SharedBudget, Span


@dataclass(eq=False)
class _Bundle:
    first_seq: int
    last_seq: int
    parts: tuple[bytes, ...]

    @property
    def size(self) -> int:
        return sum(map(len, self.parts))


def _walk(held: list[_Bundle], seq: int, max_bytes: int, upto: int | None,
          past: bool) -> tuple[int, int, int, list[bytes]] | None:
    """The lookup as a walk: the feeds' (not over ``max_bytes``, one at least) or, with
    ``past``, the store's (to the boundary at or past it, up to ``upto``)."""
    if not held or seq < held[0].first_seq:
        return None
    out: list[_Bundle] = []
    size = 0
    for bundle in held:
        if bundle.last_seq < seq:
            continue
        if upto is not None and bundle.last_seq > upto:
            break
        if not past and out and size + bundle.size > max_bytes:
            break
        out.append(bundle)
        size += bundle.size
        if past and size >= max_bytes:
            break
    if not out:
        return None
    return (out[0].first_seq, out[-1].last_seq, size,
            [part for bundle in out for part in bundle.parts])


def _found(span: Span[_Bundle] | None) -> tuple[int, int, int, list[bytes]] | None:
    if span is None:
        return None
    assert span.size == sum(map(len, span.parts))
    return span.first.first_seq, span.last.last_seq, span.size, span.parts


@pytest.mark.parametrize("pieces", [1, 2])
def test_a_lookup_finds_what_a_walk_over_the_bundles_does(pieces: int) -> None:
    rng = random.Random(37 + pieces)
    newest: NewestBundles[_Bundle] = NewestBundles(pieces)
    held: list[_Bundle] = []
    seq = 1
    for step in range(400):
        seq += rng.choice((0, 0, 0, 2))  # now and then a gap (sparse bundles, compaction)
        count = rng.randint(1, 4)
        parts = tuple(bytes([step % 251]) * rng.randint(0 if p else 1, 90)
                      for p in range(pieces))
        bundle = _Bundle(seq, seq + count - 1, parts)
        newest.append(bundle, *parts)
        held.append(bundle)
        seq += count
        while rng.random() < 0.45 and len(held) > 1:  # past the compaction threshold too
            assert newest.drop_oldest() == held.pop(0).size
        assert len(newest) == len(held) and newest.size == sum(b.size for b in held)
        assert newest.first_seq == held[0].first_seq
        after = rng.randint(held[0].first_seq - 3, seq + 2)
        assert newest.bytes_after(after) == sum(b.size for b in held if b.last_seq > after)
        if step % 7 == 0:
            for at in range(held[0].first_seq - 2, seq + 2):
                for max_bytes in (1, 50, 200):
                    for upto in (None, rng.randint(at - 2, seq)):
                        assert _found(newest.span(at, max_bytes, upto, past=True)) == \
                            _walk(held, at, max_bytes, upto, True)
                    assert _found(newest.span(at, max_bytes)) == \
                        _walk(held, at, max_bytes, None, False)
    newest.clear()
    assert len(newest) == 0 and newest.size == 0 and newest.first_seq is None
    assert newest.span(seq - 1, 100) is None and newest.bytes_after(0) == 0
    newest.append(_Bundle(seq, seq, (b"x" * pieces,)), *(b"x",) * pieces)
    assert _found(newest.span(seq, 1)) == (seq, seq, pieces, [b"x"] * pieces)


def test_a_feed_drops_what_was_served_first_and_unread_bundles_only_past_twice_it() -> None:
    newest: NewestBundles[_Bundle] = NewestBundles()
    for first in range(1, 11):  # 10 bundles of 100 bytes, sequences 1..10
        newest.append(_Bundle(first, first, (bytes(100),)), bytes(100))
    newest.trim(500, read_to=3)
    assert newest.first_seq == 4 and newest.size == 700  # the served ones went
    newest.trim(500, read_to=3)
    assert newest.size == 700  # unread: kept up to twice the budget
    newest.trim(300, read_to=3)
    assert newest.first_seq == 5 and newest.size == 600  # past twice it: unread go too
    newest.trim(0, read_to=10)
    assert newest.first_seq == 10 and newest.size == 100  # never the newest


def test_a_dropped_bundle_is_let_go_at_once_not_at_the_next_compaction() -> None:
    newest: NewestBundles[_Bundle] = NewestBundles()
    bundles = [_Bundle(first, first, (bytes(10),)) for first in range(1, 5)]
    for bundle in bundles:
        newest.append(bundle, *bundle.parts)
    oldest = weakref.ref(bundles[0])
    del bundles[0]
    newest.drop_oldest()
    gc.collect()
    assert oldest() is None
    assert newest.span(1, 100) is None
    span = newest.span(2, 100)
    assert span is not None and span.first is bundles[0] and span.parts == [bytes(10)] * 3


def test_a_shared_budget_lets_the_oldest_append_go_whoever_made_it() -> None:
    budget = SharedBudget(250)
    a: NewestBundles[_Bundle] = NewestBundles(1, budget)
    b: NewestBundles[_Bundle] = NewestBundles(1, budget)
    a.append(_Bundle(1, 1, ()), bytes(100))
    b.append(_Bundle(1, 1, ()), bytes(100))
    a.append(_Bundle(2, 2, ()), bytes(100))
    assert budget.size == 200 and len(a) == 1 and a.first_seq == 2 and len(b) == 1
    b.clear()
    assert budget.size == 100
    a.append(_Bundle(3, 3, ()), bytes(100))  # b's place in the order is skipped
    assert budget.size == 200 and len(a) == 2
    with pytest.raises(ValueError, match="negative"):
        SharedBudget(-1)
