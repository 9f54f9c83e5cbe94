"""The newest bundles of a partition, looked up by sequence.

Two caches keep them: the embedded store's tail cache (:mod:`gateway.store.tail`: what
was appended a moment ago, for the reads at the tail) and each upstream Kafka feed
(:mod:`gateway.backend.kafka.feeds`: what the feed fetched, or the gateway produced, for
every reader of the partition). Both are :class:`NewestBundles`; they differ only in
their budget:

- the store's is one byte budget for all partitions, :class:`SharedBudget`: every
  appended bundle goes in at the back, and the oldest bundles of whichever partition
  leave at the front when it is exceeded;
- a feed's is its own (:meth:`NewestBundles.trim`): the oldest bundles leave while it is
  exceeded, those a reader was served first, unread ones only past twice the budget.

Either way a partition's bundles are its newest ones, consecutive in the log, oldest
first. A lookup walks no bundle: one bisection by last sequence finds where a sequence
is (none at all for a reader at the tail), one by bytes appended how far ``max_bytes``
reaches; a span's bytes are the bundles' own pieces, joined only by whoever needs them
as one string (:func:`join`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import Final, Generic, Protocol, TypeVar

__all__ = ["Bundle", "NewestBundles", "SharedBudget", "Span", "join"]

#: Below this many dropped bundles the lists are not compacted.
_COMPACT_AT: Final = 64


class Bundle(Protocol):
    """What :class:`NewestBundles` needs of a bundle: the sequences it holds."""

    @property
    def first_seq(self) -> int:
        """The sequence of its first message."""

    @property
    def last_seq(self) -> int:
        """The sequence of its last message."""


B = TypeVar("B", bound=Bundle)


def join(parts: list[bytes]) -> bytes:
    """``parts`` as one string (a single part as it is: no copy)."""
    return parts[0] if len(parts) == 1 else b"".join(parts)


class Span(Generic[B]):
    """Consecutive bundles a lookup found: the first and the last, and their bytes."""

    __slots__ = ("first", "last", "parts", "size")

    def __init__(self, first: B, last: B, size: int, parts: list[bytes]) -> None:
        self.first = first
        self.last = last
        #: Their bytes in all.
        self.size = size
        #: Their bytes, each bundle's pieces in order (see :func:`join`).
        self.parts = parts

    def join(self) -> bytes:
        """The bundles' bytes as one string."""
        return join(self.parts)


class _Evicting(Protocol):
    def __len__(self) -> int: ...

    def drop_oldest(self) -> int: ...


class SharedBudget:
    """One byte budget for the bundles of many partitions (each a :class:`NewestBundles`
    made with it): the oldest append, whichever partition's, leaves first."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError("a bundle cache's budget can not be negative")
        self.budget = budget
        #: Bytes held, all partitions together.
        self.size = 0
        self._order: deque[_Evicting] = deque()  # whose bundle was added, oldest first

    def added(self, bundles: _Evicting, size: int) -> None:
        """``bundles`` took a bundle of ``size`` bytes: the oldest leave while over."""
        self._order.append(bundles)
        self.size += size
        while self.size > self.budget and self._order:
            oldest = self._order.popleft()
            if len(oldest):
                self.size -= oldest.drop_oldest()

    def forgot(self, size: int) -> None:
        """A partition let go of ``size`` bytes at once (cleared)."""
        # Its places in the order stay; they are skipped once it is empty.
        self.size -= size


class NewestBundles(Generic[B]):
    """One partition's newest bundles, oldest first, each with its bytes in ``pieces``
    parts (the same number for every bundle); under ``budget`` when one is given, else
    under :meth:`trim` by its owner."""

    __slots__ = ("_budget", "_bundles", "_dropped", "_ends", "_gone", "_lasts", "_parts",
                 "_pieces", "_total")

    def __init__(self, pieces: int = 1, budget: SharedBudget | None = None) -> None:
        self._pieces = pieces
        self._budget = budget
        # Parallel lists, a bundle a place: the bundles, their last sequences, and the
        # bytes appended up to and with each (counted from the first append ever, so the
        # bytes between two places are a subtraction); the pieces, ``pieces`` a bundle.
        self._bundles: list[B] = []
        self._lasts: list[int] = []
        self._ends: list[int] = []
        self._parts: list[bytes] = []
        self._dropped = 0  # places at the front that left
        self._gone = 0  # bytes appended before the first bundle held
        self._total = 0  # bytes ever appended

    def __len__(self) -> int:
        return len(self._bundles) - self._dropped

    def __iter__(self) -> Iterator[B]:
        """The bundles held, oldest first."""
        return islice(self._bundles, self._dropped, None)

    @property
    def size(self) -> int:
        """Bytes held."""
        return self._total - self._gone

    @property
    def first_seq(self) -> int | None:
        """The first sequence held, or None."""
        return self._bundles[self._dropped].first_seq if len(self) else None

    def append(self, bundle: B, *parts: bytes) -> None:
        """Hold ``bundle`` (it follows the last one held), its bytes in ``parts``."""
        size = sum(map(len, parts))
        self._bundles.append(bundle)
        self._lasts.append(bundle.last_seq)
        self._parts += parts
        self._total += size
        self._ends.append(self._total)
        if self._budget is not None:
            self._budget.added(self, size)

    def clear(self) -> None:
        """Let go of every bundle (the log was cut back, or the partition closes)."""
        size = self.size
        self._bundles.clear()
        self._lasts.clear()
        self._ends.clear()
        self._parts.clear()
        self._dropped = 0
        self._gone = self._total
        if self._budget is not None:
            self._budget.forgot(size)

    def drop_oldest(self) -> int:
        """Let go of the oldest bundle (there is one): its size."""
        d = self._dropped
        end = self._ends[d]
        size = end - self._gone
        self._gone = end
        d += 1
        k = self._pieces
        bundles = self._bundles
        if d == len(bundles) or (d >= _COMPACT_AT and d * 2 >= len(bundles)):
            del bundles[:d], self._lasts[:d], self._ends[:d], self._parts[:d * k]
            d = 0
        else:
            # What it held goes now, not at the next compaction (its place points at the
            # newest bundle, which stays; it is never read).
            bundles[d - 1] = bundles[-1]
            self._parts[(d - 1) * k:d * k] = (b"",) * k
        self._dropped = d
        return size

    def trim(self, budget: int, read_to: int) -> None:
        """A feed's budget: drop the oldest bundles while over ``budget`` bytes, those
        served to a reader (up to ``read_to``) first; unread ones only past twice the
        budget (a feed stops reading ahead of its readers at the budget, so only a
        bundle larger than it gets there); never the newest."""
        while len(self) > 1 and self.size > budget and (
                self._lasts[self._dropped] <= read_to or self.size > 2 * budget):
            self.drop_oldest()

    def bytes_after(self, seq: int) -> int:
        """Bytes held of the bundles that end after ``seq``."""
        i = bisect_right(self._lasts, seq, self._dropped)
        return self._total - (self._ends[i - 1] if i else self._gone)

    def span(self, seq: int, max_bytes: int, upto: int | None = None, *,
             past: bool = False) -> Span[B] | None:
        """The bundles from the one holding ``seq`` (or the first after it, in a gap) on,
        none ending after ``upto``, about ``max_bytes`` of them: not more (but one at
        least), or with ``past`` to the first bundle boundary at or past it. None when
        ``seq`` is before the first bundle held, or no bundle is found."""
        d = self._dropped
        bundles = self._bundles
        if len(bundles) == d or seq < bundles[d].first_seq:
            return None
        lasts = self._lasts
        top = len(lasts) - 1
        if lasts[top] < seq:
            return None
        # In the newest bundle (a reader at the tail, the usual), or bisected.
        i = top if top == d or lasts[top - 1] < seq else bisect_left(lasts, seq, d, top)
        end = top + 1
        if upto is not None and upto < lasts[top]:
            end = bisect_right(lasts, upto, i)
            if end == i:
                return None
        ends = self._ends
        start = ends[i - 1] if i else self._gone
        if past:
            j = min(bisect_left(ends, start + max_bytes, i, end) + 1, end)
        else:
            j = max(bisect_right(ends, start + max_bytes, i, end), i + 1)
        k = self._pieces
        return Span(bundles[i], bundles[j - 1], ends[j - 1] - start,
                    self._parts[i * k:j * k])
