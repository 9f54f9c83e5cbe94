"""The newest bundles of every partition, kept in memory for the readers at the tail.

Live subscribers and waiting consumers read what was appended a moment ago. Serving them
from the file means an index search, a walk over bundle headers and a ``pread`` per read;
from here it is a lookup in the partition's :class:`~gateway.io.newest.NewestBundles`.
The store holds one :class:`TailCache` with one byte budget for all partitions (a
:class:`~gateway.io.newest.SharedBudget`): every appended bundle goes in at the back,
and the oldest bundles (of whichever partition) leave at the front when the budget is
exceeded, so a partition's cached bundles are always its newest ones, in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from gateway.io.newest import NewestBundles, SharedBudget, Span

if TYPE_CHECKING:
    from gateway.store.segment import LogSegment


class TailEntry:
    """Where one framed bundle (``varint len | bundle``, its two parts kept apart by the
    cache: joining them is left to a reader, if any) is: at ``offset`` in ``segment``."""

    __slots__ = ("first_seq", "last_seq", "offset", "segment", "sparse")

    def __init__(self, first_seq: int, last_seq: int, sparse: bool, segment: LogSegment,
                 offset: int) -> None:
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.sparse = sparse
        self.segment = segment
        self.offset = offset


#: One partition's cached bundles: each held as its two pieces, length prefix and bundle.
PartitionTail: TypeAlias = NewestBundles[TailEntry]


class TailCache(SharedBudget):
    """The cached tails of all partitions of a store, within ``budget`` bytes."""

    def partition(self) -> PartitionTail:
        """A new, empty tail for a partition."""
        return NewestBundles(2, self)


def find(tail: PartitionTail, seq: int, target: int, visible_last: int
         ) -> Span[TailEntry] | None:
    """The cached bundles a read of ``seq`` gets: from the one holding ``seq`` (or the
    first after it) to the first boundary at or past ``target`` bytes, up to
    ``visible_last`` and within one segment; None when ``seq`` is not cached."""
    span = tail.span(seq, target, visible_last, past=True)
    if span is not None and span.last.segment is not span.first.segment:
        # Across a roll (rare): the read stops at the end of the first one's segment.
        last = span.first.segment.last_seq
        if last is None:  # pragma: no cover - a segment bundles were cached from has one
            return None
        span = tail.span(seq, target, min(visible_last, last), past=True)
    return span
