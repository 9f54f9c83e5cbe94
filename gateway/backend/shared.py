"""Reads shared by the readers at one partition position: one lookup, one encoding each.

When an append wakes many long polls (Tank Consumes, Kafka Fetches) parked at the same
position of a partition, each of them reads ``(seq, fetch_size)`` again, and each would
find the same bundles in the tail cache and encode the same bytes from them. A
:class:`SharedReads` memo, kept by the backend, holds the outcome of each such read for as
long as the partition is unchanged: the first reader after an append reads, the others
get a copy of its outcome. The chunk of that outcome is a :class:`SharedChunk`: the
bundles joined once into one immutable ``bytes``, and a small memo (:meth:`SharedChunk.encoded`)
where a listener keeps what it encodes from them (a Consume response's partition part, a
Fetch response's record batches), so every reader after the first reuses those bytes.

Only reads served from memory (the tail cache) are shared: a file-backed chunk holds a
reference to its segment's descriptor per reader. A partition counts as unchanged while
its ``appended_bytes`` (which only grows), high-water mark and first available sequence
are the ones the read saw, and it is not closed: the bytes at a position can only change
by a cut back, and whatever is appended after one grows ``appended_bytes``. The memo is
bounded in entries, in bytes and in the size of one chunk; it keeps only each partition's
current reads and is emptied when full.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Final, Protocol, TypeVar

from gateway.core.contract import Chunk, FetchOutcome, FetchStatus

T = TypeVar("T")

#: Largest chunk shared (a bigger one is read per reader, as before).
MAX_SHARED_CHUNK: Final = 1024 * 1024
#: Most bytes all shared chunks hold together, and most entries.
MAX_SHARED_BYTES: Final = 16 * 1024 * 1024
MAX_SHARED_ENTRIES: Final = 4096


class Encodings:
    """A memo of what readers encode from one chunk, each result under its own key: built
    by the first reader that asks (:meth:`encoded`), the same object for the others. The
    shape every chunk handed to many readers shares (a :class:`SharedChunk` here, the
    tail reader's chunks in :mod:`gateway.tail.reader`)."""

    __slots__ = ("_encoded",)

    def __init__(self) -> None:
        # Results of every kind, each under its own key.
        self._encoded: dict[Hashable, Any] | None = None

    def encoded(self, key: Hashable, build: Callable[[], T]) -> T:
        """What ``build()`` makes from this chunk for ``key``, built by the first caller
        and kept with the chunk for the others. ``key`` must name everything the result
        depends on besides the read this chunk came from (its partition, position, size
        bound and the outcome's fields)."""
        memo = self._encoded
        if memo is None:
            memo = self._encoded = {}
        elif key in memo:
            value: T = memo[key]
            return value
        value = memo[key] = build()
        return value


class SharedChunk(Encodings):
    """An in-memory chunk handed to many readers: immutable, closing it does nothing."""

    __slots__ = ("data", "length")

    def __init__(self, data: bytes) -> None:
        self._encoded = None  # (Encodings.__init__, without the call: one per shared read)
        #: The chunk's bytes (``varint len | bundle`` runs).
        self.data = data
        #: Bytes in the chunk.
        self.length = len(data)

    def read_bytes(self) -> bytes:
        """The chunk's bytes (the same object for every reader)."""
        return self.data

    def sendfile_source(self) -> None:
        """None: held in memory."""
        return None

    def close(self) -> None:
        """Nothing to release."""


class _PartitionReads:
    """One partition's shared reads while it stays as ``stamp`` says."""

    __slots__ = ("reads", "stamp")

    def __init__(self, stamp: tuple[int, int, int]) -> None:
        self.stamp = stamp
        self.reads: dict[tuple[int, int], FetchOutcome] = {}


class SharedPartition(Protocol):
    """What the memo reads of a store partition (its ``Partition``); kept by identity."""

    @property
    def appended_bytes(self) -> int: ...
    @property
    def high_water_mark(self) -> int: ...
    @property
    def first_available(self) -> int: ...
    @property
    def closed(self) -> bool: ...


class StoreRead(Protocol):
    """A store read in memory (its ``ReadResult``), as the memo takes it over."""

    @property
    def seq(self) -> int: ...
    @property
    def base_seq(self) -> int: ...
    @property
    def first_bundle_sparse(self) -> bool: ...
    @property
    def high_water_mark(self) -> int: ...
    @property
    def first_available(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def next_seq(self) -> int: ...

    def read_bytes(self) -> bytes: ...

    def close(self) -> None: ...


def read_outcome(result: StoreRead, chunk: Chunk) -> FetchOutcome:
    """The DATA outcome of a non-empty store read, its bytes in ``chunk`` (the read
    itself, or a shared copy of its bytes)."""
    return FetchOutcome(
        _DATA, high_water_mark=result.high_water_mark, first_available=result.first_available,
        base_seq=None if result.first_bundle_sparse else result.base_seq, chunk=chunk,
        resolved_seq=result.seq, next_seq=result.next_seq)


class SharedReads:
    """The current shared reads of every partition (see the module docstring).

    ``partition`` is a store partition (``appended_bytes``, ``high_water_mark``,
    ``first_available``, ``closed``); the memo never reads or holds its files.
    """

    __slots__ = ("_bytes", "_entries", "_partitions", "hits")

    def __init__(self) -> None:
        self._partitions: dict[SharedPartition, _PartitionReads] = {}
        self._bytes = 0
        self._entries = 0
        #: Reads answered from the memo (for tests and profiles).
        self.hits = 0

    def __len__(self) -> int:
        return self._entries

    @property
    def size(self) -> int:
        """Bytes of the shared chunks held."""
        return self._bytes

    def get(self, partition: SharedPartition, seq: int, fetch_size: int) -> FetchOutcome | None:
        """A copy of the shared outcome of reading ``(seq, fetch_size)`` from
        ``partition`` as it is now, or None."""
        reads = self._partitions.get(partition)
        if reads is None:
            return None
        outcome = reads.reads.get((seq, fetch_size))
        if outcome is None:
            return None
        if reads.stamp != (partition.appended_bytes, partition.high_water_mark,
                           partition.first_available) or partition.closed:
            self._drop(partition, reads)
            return None
        self.hits += 1
        return FetchOutcome(_DATA, outcome.high_water_mark, outcome.first_available,
                            outcome.base_seq, outcome.chunk, outcome.resolved_seq,
                            outcome.next_seq)

    def share(self, partition: SharedPartition, seq: int, fetch_size: int, result: StoreRead
              ) -> FetchOutcome | None:
        """The outcome of ``result`` (a non-empty in-memory store read of ``(seq,
        fetch_size)`` from ``partition``, made just now) with a :class:`SharedChunk`, kept
        for the next readers; None (nothing kept, ``result`` untouched) when it is too big
        to share. ``result`` is closed."""
        length = result.length
        if length > MAX_SHARED_CHUNK:
            return None
        stamp = (partition.appended_bytes, partition.high_water_mark,
                 partition.first_available)
        reads = self._partitions.get(partition)
        if reads is None or reads.stamp != stamp:
            if reads is not None:
                self._drop(partition, reads)
            if (self._entries >= MAX_SHARED_ENTRIES
                    or self._bytes + length > MAX_SHARED_BYTES):
                self.clear()
            reads = self._partitions[partition] = _PartitionReads(stamp)
        elif self._entries >= MAX_SHARED_ENTRIES or self._bytes + length > MAX_SHARED_BYTES:
            return None
        chunk = SharedChunk(result.read_bytes())
        result.close()
        outcome = read_outcome(result, chunk)
        old = reads.reads.get((seq, fetch_size))
        if old is not None:  # pragma: no cover - a hit would have been served instead
            self._bytes -= old.chunk.length
            self._entries -= 1
        reads.reads[(seq, fetch_size)] = outcome
        self._bytes += length
        self._entries += 1
        return FetchOutcome(_DATA, outcome.high_water_mark, outcome.first_available,
                            outcome.base_seq, chunk, outcome.resolved_seq, outcome.next_seq)

    def clear(self) -> None:
        """Forget every shared read."""
        self._partitions.clear()
        self._bytes = self._entries = 0

    def _drop(self, partition: SharedPartition, reads: _PartitionReads) -> None:
        del self._partitions[partition]
        self._entries -= len(reads.reads)
        self._bytes -= sum(o.chunk.length for o in reads.reads.values())


_DATA: Final = FetchStatus.DATA
