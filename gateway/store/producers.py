"""Idempotent producers' state of one partition, kept durably beside its log.

A Kafka client's idempotent producer stamps each batch with its producer id, epoch and
sequences; a broker keeps, per producer and partition, the epoch and the last five
batches, so that a batch retried after the broker restarted is recognised (answered with
the original's offset, not appended again). A Tank bundle has no room for those stamps,
so the partition keeps them in a file of its own, ``.kafka-producers``: one fixed-size
record per idempotent batch (producer id, epoch, first and last sequence, the first and
last sequence number the batch got in the log, a CRC).

The record is written (``write()``, in the event loop) just before its bundle, and the
file is fdatasynced in the same group-commit round as the log: the batch is acknowledged
only when both are durable, so after a crash the file is never behind the acknowledged
log. It may be ahead (the record written, the bundle lost with the segment's unsynced
tail): when the partition opens, records past the recovered log end are dropped (and the
file rewritten without them, before new appends reuse those sequence numbers). After a
power loss (not a process crash) the kernel may have written the bundle and not its
record; that batch was not acknowledged, and its retry is then appended again.

Bounded: at most ``max_states`` producers across every partition of the store (each with
at most :data:`KEEP_BATCHES` batches), and one more per partition that holds none of
them; past it a partition forgets its least recently written producer (``on_evicted``):
each partition's producers are a :class:`ProducerLRU` of the store's :class:`ProducerBudget`
(the Kafka listener's table of producers, :mod:`gateway.kafka.idempotence`, is one too).
When the file holds many more records than can be live, it is rewritten with only those
before the next record (a temporary file renamed over it; the next sync round makes both
durable, with the directory).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Final, Generic, NamedTuple, TypeVar

import structlog

from gateway.logevery import LogEvery

log = structlog.get_logger("gateway.store")

#: The file's name in the partition directory (a dot-file: the partition's own scan skips
#: it; not part of Tank's layout).
FILE_NAME: Final = ".kafka-producers"
#: Batches remembered per producer (Kafka's ``NUM_BATCHES_TO_RETAIN``).
KEEP_BATCHES: Final = 5
#: producer id, epoch, first and last sequence, first and last log sequence, CRC32.
_RECORD: Final = struct.Struct("<qhiiQQI")
RECORD_SIZE: Final = _RECORD.size
#: The file is rewritten once it holds this many records more than twice the live ones.
COMPACT_SLACK: Final = 1024


class ProducerBatch(NamedTuple):
    """The producer stamp of an idempotent batch (what the Kafka listener checked)."""

    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int


class StoredBatch(NamedTuple):
    """A batch remembered for a producer: its sequences and where the log put it."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class StoredProducer:
    """A producer on the partition: its epoch and last batches (oldest first)."""

    epoch: int
    batches: list[StoredBatch] = field(default_factory=list)

    def add(self, epoch: int, batch: StoredBatch) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()
        self.batches.append(batch)
        if len(self.batches) > KEEP_BATCHES:
            del self.batches[0]


#: What a forgotten producer means, as the budget logs it by default (a store's partitions).
PARTITION_FORGETS: Final = ("a partition forgets its least recently written idempotent "
                            "producer (that producer's next batch there is accepted at any "
                            "sequence)")


class ProducerBudget:
    """The bound on producers remembered by the :class:`ProducerLRU` that share it (all the
    store's partitions together); ``action`` says in its log line what forgetting one
    means."""

    def __init__(self, max_states: int,
                 on_evicted: Callable[[], None] | None = None, *,
                 action: str = PARTITION_FORGETS) -> None:
        self.max_states = max_states
        self.held = 0
        self.evicted = 0
        self._on_evicted = on_evicted
        self._action = action
        self._log_every = LogEvery()

    @property
    def full(self) -> bool:
        return self.held >= self.max_states

    def count_eviction(self) -> None:
        """A partition forgot a producer for the bound: count it, log it (now and then)."""
        self.evicted += 1
        if self._on_evicted is not None:
            self._on_evicted()
        if self._log_every.due() is not None:
            log.warning("producer_states_limit_reached", limit="max_producer_states",
                        max_states=self.max_states, forgotten=self.evicted,
                        action=self._action)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ProducerLRU(Generic[K, V]):
    """Producers' states by key, the least recently used first, held within a
    :class:`ProducerBudget`: adding one while the budget is full forgets the least recently
    used (unless it would be the only one: each LRU may always hold one)."""

    __slots__ = ("_budget", "_items")

    def __init__(self, budget: ProducerBudget) -> None:
        self._budget = budget
        self._items: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        """The state of ``key`` (None: not held), leaving its place in the order as is."""
        return self._items.get(key)

    def touch(self, key: K) -> None:
        """``key`` (held) was just used: it is forgotten last."""
        self._items.move_to_end(key)

    def add(self, key: K, value: V, *, count: bool = True) -> V:
        """Hold ``value`` for ``key`` (not held), as the most recently used; when the budget
        is full, forget the least recently used first (counted by the budget when
        ``count``). Returns ``value``."""
        if self._budget.full and self._items:
            self._items.popitem(last=False)
            self._budget.held -= 1
            if count:
                self._budget.count_eviction()
        self._items[key] = value
        self._budget.held += 1
        return value

    def pop(self, key: K) -> V | None:
        """Forget ``key``; its state, or None when it was not held."""
        value = self._items.pop(key, None)
        if value is not None:
            self._budget.held -= 1
        return value

    def clear(self) -> None:
        """Forget every state, giving back their places in the budget."""
        self._budget.held -= len(self._items)
        self._items.clear()

    def items(self) -> Iterator[tuple[K, V]]:
        """``(key, state)`` pairs, the least recently used first."""
        return iter(self._items.items())


def _pack(producer_id: int, epoch: int, batch: StoredBatch) -> bytes:
    head = _RECORD.pack(producer_id, epoch, batch.first_seq, batch.last_seq,
                        batch.first_offset, batch.last_offset, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def _unpack(data: bytes, pos: int) -> tuple[int, int, StoredBatch] | None:
    """The record at ``pos``, or None when its CRC does not match (a torn write)."""
    pid, epoch, first, last, first_offset, last_offset, crc = _RECORD.unpack_from(data, pos)
    if zlib.crc32(data[pos:pos + RECORD_SIZE - 4]) != crc:
        return None
    return pid, epoch, StoredBatch(first, last, first_offset, last_offset)


class ProducerTable:
    """One partition's producers, in memory and in its ``.kafka-producers`` file. The file
    is opened for each record and for each sync round, never held open (a partition's
    descriptors stay those of its segments). Not thread-safe: used from the trio thread,
    or while the partition loads."""

    def __init__(self, directory: str, budget: ProducerBudget) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self._producers: ProducerLRU[int, StoredProducer] = ProducerLRU(budget)
        #: Bytes and records in the file (only this table writes it).
        self._size = 0
        self._records = 0
        #: Written since the last sync round.
        self._dirty = False
        #: The file was created or replaced: the directory must be synced too.
        self.renamed = False
        #: The file opened for appends, kept from record to record (an open and a close
        #: per idempotent batch cost more than its write); closed when the file is
        #: replaced and by :meth:`close`.
        self._append_fd: int | None = None

    def __len__(self) -> int:
        return len(self._producers)

    def get(self, producer_id: int) -> StoredProducer | None:
        """The producer's remembered state (None: never seen, or forgotten)."""
        return self._producers.get(producer_id)

    # -- opening ---------------------------------------------------------------------------

    def load(self, log_end: int) -> None:
        """Read the file (blocking), keeping the records of batches the log holds (last
        sequence at most ``log_end``); rewrite it when something was dropped."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        dropped = 0
        torn = len(data) % RECORD_SIZE
        for pos in range(0, len(data) - torn, RECORD_SIZE):
            record = _unpack(data, pos)
            if record is None:
                torn = len(data) - pos
                break
            pid, epoch, batch = record
            if batch.last_offset > log_end:
                dropped += 1
                continue
            self._remember(pid, epoch, batch, count=False)
        if dropped or torn:
            log.warning("producer_state_records_dropped", file=self.path,
                        past_log_end=dropped, torn_bytes=torn, log_end=log_end)
        self._records = (len(data) - torn) // RECORD_SIZE - dropped
        self._size = len(data)
        if dropped or torn or self._compaction_due():
            self._rewrite(sync=True)
            self._sync_now()
            self._dirty = False

    # -- writing ---------------------------------------------------------------------------

    def record(self, batch: ProducerBatch, first_offset: int, last_offset: int
               ) -> Callable[[], None]:
        """Remember ``batch`` stored at ``first_offset..last_offset`` and write its
        record (raises OSError: then nothing changed). Returns the undo, for when the
        bundle's own write then fails."""
        stored = StoredBatch(batch.first_seq, batch.last_seq, first_offset, last_offset)
        if self._compaction_due():
            self._rewrite(sync=False)
        size = self._size
        fd = self._append_fd
        if fd is None:
            fd = self._append_fd = os.open(
                self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            if os.write(fd, _pack(batch.producer_id, batch.epoch, stored)) != RECORD_SIZE:
                os.ftruncate(fd, size)
                raise OSError(f"short write to {self.path}")
        except OSError:
            self._close_append()  # opened afresh by the next record
            raise
        if not size:
            self.renamed = True  # perhaps a new directory entry
        self._size += RECORD_SIZE
        self._records += 1
        self._dirty = True
        before = self._producers.get(batch.producer_id)
        saved = None if before is None else (before.epoch, list(before.batches))
        self._remember(batch.producer_id, batch.epoch, stored)

        def undo() -> None:
            os.truncate(self.path, size)
            self._size = size
            self._records -= 1
            if saved is None:
                self._producers.pop(batch.producer_id)
            else:
                restored = self._producers.get(batch.producer_id)
                if restored is not None:
                    restored.epoch, restored.batches = saved

        return undo

    def cut(self, log_end: int) -> None:
        """Forget the batches past ``log_end`` (the log lost them: a failed fsync cut the
        unsynced tail back) and rewrite the file without them."""
        for pid, producer in list(self._producers.items()):
            producer.batches = [b for b in producer.batches if b.last_offset <= log_end]
            if not producer.batches:
                self._producers.pop(pid)
        if self._size:
            self._rewrite(sync=False)

    def sync_fd(self) -> int | None:
        """A descriptor (the caller's to close) to fdatasync in this round, or None when
        nothing was written since the last round (when :attr:`renamed` is set, the
        directory must be synced in the round too)."""
        if not self._dirty:
            return None
        self._dirty = False
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        """Give back the producers' places in the budget and the file's descriptor (the
        file stays)."""
        self._producers.clear()
        self._close_append()

    def _close_append(self) -> None:
        fd, self._append_fd = self._append_fd, None
        if fd is not None:
            os.close(fd)

    # -- inside ----------------------------------------------------------------------------

    def _compaction_due(self) -> bool:
        """Whether the file holds many more records than can be live (O(1): bounds the
        live ones by the producers' count)."""
        return self._records >= len(self._producers) * KEEP_BATCHES * 2 + COMPACT_SLACK

    def _remember(self, producer_id: int, epoch: int, batch: StoredBatch, *,
                  count: bool = True) -> None:
        producer = self._producers.get(producer_id)
        if producer is None:
            producer = self._producers.add(producer_id, StoredProducer(epoch), count=count)
        else:
            self._producers.touch(producer_id)
        producer.add(epoch, batch)

    def _rewrite(self, *, sync: bool) -> None:
        """Replace the file by one with the live records only: a temporary file renamed
        over it. ``sync``: fsync it now (while loading); else the next sync round does
        (in the event loop it is small, and rare: amortised, a record or two per record
        written)."""
        data = b"".join(_pack(pid, p.epoch, b) for pid, p in self._producers.items()
                        for b in p.batches)
        tmp = os.path.join(os.path.dirname(self.path), FILE_NAME + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._close_append()  # it holds the file replaced
        self._size = len(data)
        self._records = len(data) // RECORD_SIZE
        self._dirty = True
        self.renamed = True

    def _sync_now(self) -> None:
        """fsync the directory (while loading: blocking is fine there)."""
        fd = os.open(os.path.dirname(self.path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.renamed = False
