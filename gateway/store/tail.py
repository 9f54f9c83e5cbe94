"""The newest bundles of every partition, kept in memory for the readers at the tail.

Live subscribers and waiting consumers read what was appended a moment ago. Serving them
from the file means an index search, a walk over bundle headers and a ``pread`` per read;
from here it is a lookup in the partition's list of recent bundles. The store holds one
:class:`TailCache` with one byte budget for all partitions: every appended bundle goes in
at the back, and the oldest bundles (of whichever partition) leave at the front when the
budget is exceeded, so a partition's cached bundles are always its newest ones, in order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from typing import Any, Final

#: Below this many dropped entries a partition's list is not compacted.
_COMPACT_AT: Final = 64


class TailEntry:
    """One framed bundle (``prefix | bundle``: ``varint len | bundle``) at ``offset`` in
    ``segment``. The two parts stay apart: joining them is left to a reader, if any."""

    __slots__ = ("bundle", "first_seq", "last_seq", "offset", "prefix", "segment", "size",
                 "sparse")

    def __init__(self, first_seq: int, last_seq: int, sparse: bool, segment: Any,
                 offset: int, prefix: bytes, bundle: bytes) -> None:
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.sparse = sparse
        self.segment = segment
        self.offset = offset
        self.prefix = prefix
        self.bundle = bundle
        self.size = len(prefix) + len(bundle)


_GONE: Final = TailEntry(0, 0, False, None, 0, b"", b"")


class PartitionTail:
    """One partition's cached bundles, oldest first (consecutive in the log)."""

    __slots__ = ("_cache", "_dropped", "_entries", "_firsts")

    def __init__(self, cache: TailCache) -> None:
        self._cache = cache
        self._entries: list[TailEntry] = []
        self._firsts: list[int] = []
        self._dropped = 0  # entries at the front of the lists that left the cache

    def __len__(self) -> int:
        return len(self._entries) - self._dropped

    @property
    def first_seq(self) -> int | None:
        """The first sequence number cached, or None."""
        return self._firsts[self._dropped] if len(self) else None

    def add(self, entry: TailEntry) -> None:
        """Cache the bundle just appended (it follows the last one cached)."""
        self._entries.append(entry)
        self._firsts.append(entry.first_seq)
        self._cache._added(self, entry.size)

    def clear(self) -> None:
        """Forget every entry (the log was cut back, or the partition closes)."""
        self._cache._forget(self, sum(e.size for e in self._entries[self._dropped:]))
        self._entries.clear()
        self._firsts.clear()
        self._dropped = 0

    def find(self, seq: int, visible_last: int) -> list[TailEntry] | None:
        """The cached bundles from the one holding ``seq`` (or the first after it), up
        to ``visible_last`` and within one segment; None when ``seq`` is not cached."""
        first = self.first_seq
        if first is None or seq < first or seq > visible_last:
            return None
        i = max(bisect_right(self._firsts, seq, self._dropped) - 1, self._dropped)
        entries = self._entries
        if entries[i].last_seq < seq:
            i += 1  # seq falls in a gap before a sparse bundle
        out = []
        segment = entries[i].segment if i < len(entries) else None
        while i < len(entries) and entries[i].last_seq <= visible_last \
                and entries[i].segment is segment:
            out.append(entries[i])
            i += 1
        return out or None

    def _drop_oldest(self) -> int:
        entry = self._entries[self._dropped]
        self._entries[self._dropped] = _GONE  # its bytes go now, not at the next compaction
        self._dropped += 1
        if self._dropped >= _COMPACT_AT and self._dropped * 2 >= len(self._entries):
            del self._entries[:self._dropped]
            del self._firsts[:self._dropped]
            self._dropped = 0
        return entry.size


class TailCache:
    """The cached tails of all partitions of a store, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError("the tail cache budget can not be negative")
        self.budget = budget
        #: Bytes of framed bundles cached.
        self.size = 0
        self._order: deque[PartitionTail] = deque()  # whose entry was added, oldest first

    def partition(self) -> PartitionTail:
        """A new, empty tail for a partition."""
        return PartitionTail(self)

    def _added(self, tail: PartitionTail, size: int) -> None:
        self._order.append(tail)
        self.size += size
        while self.size > self.budget and self._order:
            oldest = self._order.popleft()
            if len(oldest):
                self.size -= oldest._drop_oldest()

    def _forget(self, tail: PartitionTail, size: int) -> None:
        # The tail's places in the order stay; they are skipped once it is empty.
        self.size -= size
