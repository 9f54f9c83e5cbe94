"""One partition: an append-only sequence of segments in ``<data>/<topic>/<partition>/``.

:class:`Partition` is the public face. It holds what its appends and reads touch every
time (the active segment, the high-water marks, the cached tail) and runs those paths
itself, with no layer between; its other jobs are its collaborators':

- opening and recovery: :func:`gateway.store.opening.open_segments`;
- append planning: :func:`gateway.store.appending.plan_append`;
- appends that wait their turn: :class:`gateway.store.queueing.AppendQueue`;
- appends waiting for their fsync: :mod:`gateway.store.syncing` (and the group commit,
  :class:`gateway.store.durability.GroupCommit`);
- segment roll and retention: :class:`gateway.store.rolling.SegmentChain`;
- damage checks of rolled segments: :class:`gateway.store.checks.SegmentChecks`;
- reads below the cached tail: :func:`gateway.store.reading.read_segments`;
- waiters: :class:`gateway.store.waiters.Waiters`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import ClassVar, TypedDict, Unpack

import structlog
import trio

from gateway.io.completion import completed
from gateway.store.appending import (
    MAX_CHOSEN_SEQ,
    AppendEntry,
    AppendOutcome,
    MustWait,
    Plan,
    check_bundle,
    plan_append,
    too_large,
)
from gateway.store.appending import varint as _varint
from gateway.store.checks import SegmentChecks
from gateway.store.config import TopicConfig
from gateway.store.damage import Damage
from gateway.store.disk import FSYNC, describe_fault, fault_kind
from gateway.store.durability import Durability, GroupCommit, SyncJob, Ticket
from gateway.store.env import PartitionEnv
from gateway.store.errors import OutOfRange, StoreClosed, StoreError, StoreIOError
from gateway.store.index import ENTRY_SIZE
from gateway.store.opening import open_segments
from gateway.store.producers import ProducerBatch, ProducerBudget, ProducerTable, StoredProducer
from gateway.store.queueing import AppendQueue
from gateway.store.reading import MIN_FETCH, read_cached, read_segments
from gateway.store.results import AppendResult, ReadResult
from gateway.store.rolling import PREFILL_AHEAD, PREFILL_LOW, SegmentChain
from gateway.store.segment import MAX_REL_SEQ, LogSegment
from gateway.store.syncing import Written, cut_back_unsynced, report_when_durable
from gateway.store.tail import TailEntry, find
from gateway.store.waiters import Waiters
from protocols.errors import ProtocolError
from protocols.tank.bundle import SPARSE_FLAG, BundleInfo, validate_bundle
from protocols.wire import UINT64_MAX, encode_varint, varint_size

__all__ = ["MAX_CHOSEN_SEQ", "MIN_FETCH", "PREFILL_AHEAD", "PREFILL_LOW", "AppendEntry",
           "AppendOutcome", "Partition", "PartitionEnv"]

log = structlog.get_logger("gateway.store")



class _Where(TypedDict, total=False):
    """Where a failed write was, besides the partition (for its log line)."""

    segment: str


class Partition:
    """A partition of a topic: appends, reads, notification, rolling and retention.

    Sequence numbers start at 1. ``high_water_mark`` is the last sequence number
    readers may see (in ``fsync`` durability, only fsynced bundles);
    ``first_available`` is the base of the oldest segment: 0 for a partition that
    never held a message (Tank's DiscoverPartitions says ``(0, 0)`` then), and
    ``high_water_mark + 1`` when retention removed every message.
    """

    #: Take the one-call path for the usual append (:meth:`_append_plain_now`); tests
    #: turn it off to compare it with the general path, its reference.
    fast_append: ClassVar[bool] = True

    def __init__(self, topic: str, index: int, directory: str, config: TopicConfig,
                 env: PartitionEnv) -> None:
        self.topic = topic
        self.index = index
        self.directory = directory
        self.config = config
        self._env = env
        self._fsync = env.durability is Durability.FSYNC
        self._log = log.bind(topic=topic, partition=index)
        #: The segments in base order (the active one last) and their bases: the chain
        #: changes them, reads look them up.
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._checks = SegmentChecks(env, self._segments,
                                     lambda: self.config.index_interval_bytes, self._log)
        self._chain = SegmentChain(directory, env, self._segments, self._bases, self._checks,
                                   lambda: self.config, self._log, topic, index)
        self._active: LogSegment | None = None
        self._hwm = 0
        self._written_hwm = 0
        #: Framed bytes made visible since the store opened (for Tank's minBytes).
        self.appended_bytes = 0
        self._wake = Waiters()
        # The one-call append wakes these inline (never replaced).
        self._changed = self._wake.lot
        self._waiters = self._wake.events
        self._tail = env.tail.partition() if env.tail is not None and env.tail.budget else None
        self._lock = trio.Lock()
        self._commit = GroupCommit(env.syncer, prepare=self._prepare_sync,
                                   on_durable=self._on_durable, on_failure=self._on_sync_failed,
                                   observe=env.observe_fsync)
        self._queue = AppendQueue(self._lock, self._write_all_now, self._commit.drain, env.spawn)
        self._producers = ProducerTable(directory, env.producers or ProducerBudget(1 << 62))
        self._unflushed_msgs = 0
        self._dirty_since: float | None = None
        self._roll_at = math.inf
        self._closed = False
        self._broken: str | None = None

    def __repr__(self) -> str:
        return (f"<Partition {self.topic}/{self.index} first={self.first_available} "
                f"hwm={self._hwm} segments={len(self._segments)}>")

    # -- state ----------------------------------------------------------------------------------

    @property
    def high_water_mark(self) -> int:
        """Sequence number of the last visible message (0 when none ever was)."""
        return self._hwm

    @property
    def first_available(self) -> int:
        """Sequence number of the first message still stored (see the class docstring)."""
        return self._bases[0] if self._bases else 0

    @property
    def segment_count(self) -> int:
        """Segment files, the active one included."""
        return len(self._segments)

    @property
    def size_bytes(self) -> int:
        """Bytes in all segment files."""
        return sum(s.size for s in self._segments)

    @property
    def holds_files(self) -> bool:
        """Whether the partition holds its active segment's files open (from its first
        append on)."""
        return self._active is not None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def producer_count(self) -> int:
        """Idempotent producers the partition remembers."""
        return len(self._producers)

    def stored_producer(self, producer_id: int) -> StoredProducer | None:
        """What the partition durably remembers of an idempotent producer (its epoch and
        last batches, with their sequence numbers in the log), or None."""
        return self._producers.get(producer_id)

    @property
    def damage(self) -> list[tuple[str, Damage]]:
        """``(segment name, damage)`` of every damaged region found so far."""
        return self._checks.damage()

    def load(self) -> None:
        """Open the partition's files, recovering the active segment. Blocking; runs once."""
        opened = open_segments(self.directory, self.config, self._env, self._checks,
                               self._log)
        self._chain.adopt(opened.segments)
        self._active = opened.active
        self._hwm = self._written_hwm = opened.high_water_mark
        self._producers.load(self._hwm)
        if self._active is not None:
            self._roll_at = self._chain.roll_deadline(self._active.created_ts)

    # -- appending ------------------------------------------------------------------------------

    async def append(self, bundle: bytes, *, base_seq: int | None = None) -> AppendResult:
        """Append an encoded bundle (no length prefix) and return its sequence numbers.

        A plain bundle of n messages gets ``hwm+1 .. hwm+n``; with ``base_seq``
        (ProduceWithSeqnum, mirroring) it gets ``base_seq .. base_seq+n-1``, and a
        sparse bundle keeps the sequence numbers in its header. Both must start above
        the high-water mark, else :class:`InvalidSequence` (Tank code 10). The bundle
        is fully validated before anything is written (:class:`InvalidBundle`,
        :class:`BundleTooLarge`); a failed write or fsync raises :class:`StoreIOError`
        and leaves nothing visible. Returns once the bundle is durable in the
        partition's durability mode; it is then visible to readers and waiters.
        """
        [outcome] = await self.append_many([(bundle, base_seq)])
        if isinstance(outcome, StoreError):
            raise outcome
        return outcome

    async def append_many(self, entries: Sequence[AppendEntry]) -> list[AppendOutcome]:
        """Append ``(bundle, base_seq[, info])`` entries in order; one fsync round covers
        them all.

        Each entry behaves as :meth:`append` would, but a failing entry does not stop
        the others: its error takes its place in the returned list. An entry's third
        item, when given, is the header of a bundle the caller built itself: it is
        trusted, not validated again. Returns once every written entry is durable.
        """
        self._check_usable()
        return await completed(lambda report: self.append_nowait(entries, report))

    def append_nowait(self, entries: Sequence[AppendEntry],
                      on_done: Callable[[list[AppendOutcome]], None]) -> None:
        """Append like :meth:`append_many`, without waiting: ``on_done(outcomes)`` is
        called in the trio thread once every entry is durable or failed.

        The bundles are written before this returns whenever nothing else holds the
        partition (the usual case), so appends made one after the other land in that
        order; ``on_done`` runs the moment their fsync returns, or before this returns
        when no fsync is needed. Otherwise (an async append in progress, a segment roll
        that must wait for pending fsyncs) a task of the store finishes the job, still in
        call order.
        """
        if self._lock.locked() or self._queue.waiting:
            self._queue.later(entries, on_done)
            return
        if self.fast_append and not self._fsync and len(entries) == 1:
            result = self._append_plain_now(entries[0])
            if result is not None:
                on_done([result])
                return
        try:
            outcomes, tickets = self._write_all_now(entries)
        except MustWait as wait:
            self._queue.later(entries, on_done, wait.outcomes, wait.tickets)
            return
        report_when_durable(outcomes, tickets, on_done)

    def _write_all_now(self, entries: Sequence[AppendEntry]
                       ) -> tuple[list[AppendOutcome], list[tuple[int, Ticket[Written]]]]:
        """Write entries until one needs the pending fsyncs drained first (then raise
        :class:`MustWait` carrying what was written so far)."""
        outcomes: list[AppendOutcome] = []
        tickets: list[tuple[int, Ticket[Written]]] = []
        one_call = self.fast_append and not self._fsync
        try:
            for entry in entries:
                if one_call:
                    plain = self._append_plain_now(entry)
                    if plain is not None:
                        outcomes.append(plain)
                        continue
                try:
                    result, ticket = self._write_now(*entry)
                except StoreError as exc:
                    outcomes.append(exc)
                    continue
                except MustWait as wait:
                    wait.outcomes, wait.tickets = outcomes, tickets
                    raise
                if ticket is not None:
                    tickets.append((len(outcomes), ticket))
                outcomes.append(result)
        finally:
            if tickets:
                self._commit.start()  # one round for everything written here
        return outcomes, tickets

    def append_plain(self, bundle: bytes, msg_count: int) -> AppendResult | None:
        """Append ``bundle``, a plain bundle of ``msg_count`` messages the caller validated,
        now and in one call, as :meth:`append_nowait` would (an ``os``-durability append
        that needs no fsync): the result, or None, having done nothing, whenever the
        general path must take it (``fsync`` durability, the partition held by another
        append, a segment roll, a failed write, a bundle over the size limit)."""
        if self._lock.locked() or self._queue.waiting or self._fsync or not self.fast_append:
            return None
        try:
            return self._append_validated(bundle, msg_count)
        except OSError:
            return None  # the write was cut back: the general path retries and reports

    def _append_plain_now(self, entry: AppendEntry) -> AppendOutcome | None:
        """The usual append in ``os`` durability, in one call: a plain bundle (no chosen
        sequence, no producer state) that fits the active segment. Does what
        :meth:`_write_now` and :meth:`_execute` do for it and returns the outcome; None,
        having done nothing, when the general path must take the entry (anything that
        plans a segment change, a gap, a sparse bundle, an error to report)."""
        bundle = entry[0]
        info = entry[2] if len(entry) > 2 else None
        if entry[1] or (len(entry) > 3 and entry[3] is not None):
            return None
        if info is None:
            try:
                info = validate_bundle(bundle)
            except ProtocolError:
                return None  # the general path reports it
        if info.sparse:
            return None
        try:
            return self._append_validated(bundle, info.msg_count)
        except OSError as exc:
            assert self._active is not None
            return self._failed("append", exc, segment=self._active.name)

    def _append_validated(self, bundle: bytes, msg_count: int) -> AppendResult | None:
        """The write of :meth:`_append_plain_now` once the bundle is known to be plain and
        valid; None, having done nothing, when it needs the general path (a closed or
        failed partition, a bundle over the size limit, a segment roll). Raises the
        write's OSError (the segment then cut back)."""
        seg = self._active
        if (seg is None or not seg.size or self._closed or self._broken is not None
                or len(bundle) > self._env.max_bundle_size):
            return None
        first = self._written_hwm + 1
        last = first + msg_count - 1
        size = len(bundle)
        prefix = _varint(size)
        framed = len(prefix) + size
        now = self._env.clock()
        if (seg.size + framed > self.config.segment_bytes or last >= UINT64_MAX
                or seg.index().size_bytes + ENTRY_SIZE > self.config.index_max_bytes
                or last - seg.base > MAX_REL_SEQ or now >= self._roll_at):
            return None  # a segment roll: the general path
        disk = self._env.disk
        if disk is not None and not disk.take(framed):
            return None  # refused below the floor: the general path says so
        offset = seg.append(prefix, bundle, first, last, self.config.index_interval_bytes)
        if disk is not None and disk.fault is not None:
            disk.wrote()
        self._written_hwm = last
        if self._tail is not None:
            self._tail.append(TailEntry(first, last, False, seg, offset), prefix, bundle)
        seg.visible_size = seg.size
        self._hwm = last
        self.appended_bytes += framed
        self._changed.unpark_all()
        if self._waiters:
            self._wake.set_events()
        self._count_unflushed(msg_count, now)
        return AppendResult(first, last, framed)

    def _write_now(self, bundle: bytes, base_seq: int | None, info: BundleInfo | None = None,
                   producer: ProducerBatch | None = None
                   ) -> tuple[AppendResult, Ticket[Written] | None]:
        """Validate (unless ``info`` vouches for the bundle), plan and write one bundle
        (and, for an idempotent producer's batch, its producer state record first).

        Raises :class:`MustWait` when the bundle needs a new segment while appends still
        wait for their fsync: every non-durable byte stays in the active segment.
        """
        if info is None:
            info = check_bundle(bundle, self._env.max_bundle_size)
        elif len(bundle) > self._env.max_bundle_size:
            raise too_large(bundle, self._env.max_bundle_size)
        if base_seq == 0:
            base_seq = None  # Tank: an explicit first sequence of 0 means "not given"
        self._check_usable()
        now = self._env.clock()
        plan = plan_append(info, bundle, base_seq, self._written_hwm, self._active,
                           self._roll_at, now, self.config, self._env.max_bundle_size,
                           self._log)
        if plan.action and self._active is not None and self._commit.pending:
            raise MustWait()
        return self._execute(plan, info.msg_count, now, producer)

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosed(f"partition {self.topic}/{self.index} is closed")
        if self._broken is not None:
            raise StoreIOError(f"partition {self.topic}/{self.index} failed: {self._broken}; "
                               "reopen the store to recover it")

    def _execute(self, plan: Plan, msg_count: int, now: float,
                 producer: ProducerBatch | None = None
                 ) -> tuple[AppendResult, Ticket[Written] | None]:
        """The synchronous part of an append: the disk's room for it, segment changes and
        the write."""
        disk = self._env.disk
        if disk is not None:
            framed = varint_size(len(plan.data)) + len(plan.data)
            seg = self._active
            ahead = seg.prefilled - seg.size if seg is not None and not plan.action else 0
            grow = framed - min(framed, ahead)  # the zeros ahead are space taken already
            if grow and not disk.take(grow):
                raise disk.refused(grow, topic=self.topic, partition=self.index)
        if plan.action is not None:
            try:
                self._change_segment(plan.action, plan.first, now)
            except OSError as exc:
                raise self._failed("segment", exc) from exc
        seg = self._active
        assert seg is not None
        prefix = encode_varint(len(plan.data))
        undo = None
        if producer is not None:
            # Written first: a record whose bundle is lost is dropped at the next open; a
            # bundle whose record is lost would be appended again when retried.
            try:
                undo = self._producers.record(producer, plan.first, plan.last)
            except OSError as exc:
                raise self._failed("producer_state", exc) from exc
        try:
            offset = seg.append(prefix, plan.data, plan.first, plan.last,
                                self.config.index_interval_bytes)
        except OSError as exc:
            failure = self._failed("append", exc, segment=seg.name)
            if undo is not None:
                try:
                    undo()
                except OSError as undo_exc:
                    self._broken = f"cannot take back a producer state record: {undo_exc}"
                    self._log.error("partition_broken", error=str(undo_exc))
            raise failure from exc
        if disk is not None and disk.fault is not None:
            disk.wrote()
        self._written_hwm = plan.last
        size = len(prefix) + len(plan.data)
        if self._fsync and seg.prefilled - seg.size < PREFILL_LOW:
            self._chain.prefill(seg)
        if self._tail is not None:
            self._tail.append(TailEntry(plan.first, plan.last,
                                        bool(plan.data[0] & SPARSE_FLAG), seg, offset),
                              prefix, plan.data)
        result = AppendResult(plan.first, plan.last, size)
        if self._fsync:
            return result, self._commit.add(Written(seg.size, plan.last, size))
        self._publish(seg.size, plan.last, size)
        self._count_unflushed(msg_count, now)
        return result, None

    def _failed(self, operation: str, exc: OSError, **where: Unpack[_Where]) -> StoreIOError:
        """The error of a failed write (recorded, counted and logged by the disk's guard;
        logged here where there is none)."""
        disk = self._env.disk
        if disk is not None:
            return disk.failed(operation, exc, topic=self.topic, partition=self.index, **where)
        self._log.error("store_write_failed", operation=operation, error=str(exc), **where)
        kind = fault_kind(exc)
        return StoreIOError(f"{describe_fault(kind)}: {operation} failed: {exc}", kind)

    def _count_unflushed(self, msg_count: int, now: float) -> None:
        if self._dirty_since is None:
            self._dirty_since = now
        self._unflushed_msgs += msg_count
        limit = self.config.flush_messages
        if limit and self._unflushed_msgs >= limit:
            self._unflushed_msgs = 0
            self._commit.request()

    def _publish(self, end: int, last_seq: int, size: int) -> None:
        """Make everything up to ``end`` of the active segment visible and wake waiters."""
        seg = self._active
        assert seg is not None
        seg.visible_size = end
        self._hwm = last_seq
        self.appended_bytes += size
        self._wake.notify()

    def hand_back_zeros(self) -> int:
        """Cut the zeros written ahead of the active segment (space is short); the bytes
        given back. The next appends prefill again only as the disk's guard allows."""
        return self._chain.hand_back_zeros(self._active)

    # -- segment changes (the chain's work; the partition keeps the active segment) ---------------

    def _change_segment(self, action: str, first: int, now: float) -> None:
        """Make the segment change ``action`` of a plan whose bundle starts at ``first``:
        drop an empty active segment based elsewhere, or roll the active one; then start
        one based at ``first`` and apply retention (Tank does when a segment rolls)."""
        if action == "replace":
            assert self._active is not None
            self._chain.drop_empty(self._active)
            self._active = None
        elif action != "create":
            self._roll_active(now)
        if self._active is None:
            self._start_segment(first, now)
            self._chain.apply_retention(now, has_active=True)

    def _start_segment(self, base: int, now: float) -> None:
        seg = self._active = self._chain.start(base, now)
        self._roll_at = self._chain.roll_deadline(seg.created_ts)

    def _roll_active(self, now: float) -> None:
        """Freeze the active segment as ``.ilog``; the caller starts the next one."""
        seg = self._active
        assert seg is not None
        rolled = seg.size != 0
        self._chain.roll(seg, now)
        self._active = None
        if rolled:
            self._roll_at = math.inf
            if not self._fsync:
                self._commit.request()

    # -- durability (the group commit's callbacks) ------------------------------------------------

    def _prepare_sync(self) -> SyncJob:
        self._dirty_since = None
        return self._chain.sync_job(self._active, self._producers)

    def _on_durable(self, payloads: Sequence[Written]) -> None:
        disk = self._env.disk
        if disk is not None and disk.fault is not None:
            disk.synced()
        if payloads:
            self._publish(payloads[-1].end, payloads[-1].last_seq,
                          sum(p.size for p in payloads))

    def _on_sync_failed(self, error: OSError, payloads: Sequence[Written]) -> None:
        if self._env.disk is not None:
            self._env.disk.failed(FSYNC, error, topic=self.topic, partition=self.index,
                                  appends_failed=len(payloads))
        else:
            self._log.error("fsync_failed", error=str(error), appends_failed=len(payloads))
        if not payloads:
            return
        assert self._active is not None
        broken = cut_back_unsynced(self._active, self._hwm, self._producers, self._tail,
                                   self._log)
        self._written_hwm = self._hwm
        if broken is not None:
            self._broken = broken

    # -- reading ------------------------------------------------------------------------------

    def read(self, seq: int, fetch_size: int) -> ReadResult:
        """Whole bundles from the one holding ``seq``, at least ``fetch_size`` bytes if available.

        ``seq`` 0 means the first available message, ``UINT64_MAX`` the tail
        (``high_water_mark + 1``). At the tail the result is empty (``at_tail``): wait
        with :meth:`wait_for`. Below ``first_available`` or above the tail raises
        :class:`OutOfRange`. The range starts at the bundle that holds ``seq`` (or the
        first bundle after it, in a sequence gap), runs to the first bundle boundary at
        or past ``max(fetch_size, 32)`` bytes (so a single huge bundle comes whole),
        stops at the high-water mark and never crosses a segment.

        A rolled segment is checked for damage the first time it is read (see
        :mod:`gateway.store.damage`); a big one in a worker thread, meanwhile this raises
        :class:`SegmentCheckPending`. Damaged bytes are never served: a ``seq`` they held
        reads from the next readable sequence number instead (``base_seq`` above
        ``seq``), or finds nothing until new appends when nothing readable follows.
        """
        if self._closed:
            raise StoreClosed(f"partition {self.topic}/{self.index} is closed")
        hwm = self._hwm
        first_available = self.first_available
        if seq == 0:
            seq = first_available if 0 < first_available <= hwm else hwm + 1
        elif seq == UINT64_MAX:
            seq = hwm + 1
        if seq == hwm + 1:
            return ReadResult(seq=seq, base_seq=seq, first_bundle_sparse=False,
                              high_water_mark=hwm, first_available=first_available,
                              next_seq=seq)
        if seq > hwm + 1 or seq < first_available:
            raise OutOfRange(seq, first_available, hwm)
        cached = (find(self._tail, seq, max(fetch_size, MIN_FETCH), hwm)
                  if self._tail is not None else None)
        if cached is not None:
            return read_cached(seq, cached, hwm, first_available)
        return read_segments(self._segments, self._bases, self._checks, seq, fetch_size, hwm,
                             first_available, self.config.index_interval_bytes, self._log)

    async def wait_checks(self) -> None:
        """Wait for the damage checks running in worker threads (see
        :class:`SegmentCheckPending`)."""
        await self._checks.wait()

    # -- waiting --------------------------------------------------------------------------------

    async def wait_for(self, seq: int, deadline: float = math.inf) -> bool:
        """Park until ``high_water_mark >= seq`` or the trio clock reaches ``deadline``.

        Returns whether the high-water mark got there. Wakes right after the append
        that makes ``seq`` visible. An idle waiter costs nothing but its parked task.
        Returns False at once if the partition is closed.
        """
        await self._wake.wait_until(lambda: self._hwm >= seq or self._closed, deadline)
        return self._hwm >= seq

    async def wait_changed(self) -> None:
        """Park until the next visible append (or close). Every reader of the partition
        that waits parks in one lot, woken together."""
        await self._wake.park()

    def add_waiter(self, event: trio.Event) -> None:
        """Set ``event`` at the next visible append (or close). One event can wait on many
        partitions this way, with no task per partition; see :meth:`remove_waiter`."""
        self._wake.add(event)

    def remove_waiter(self, event: trio.Event) -> None:
        """Forget ``event`` (after a wait that ended otherwise)."""
        self._wake.remove(event)

    # -- maintenance and closing -------------------------------------------------------------------

    async def maintain(self, now: float | None = None) -> None:
        """Roll the active segment by age, apply retention, honour ``flush.secs``."""
        if self._closed:
            return
        async with self._lock:
            if self._closed:
                return
            now = self._env.clock() if now is None else now
            seg = self._active
            if seg is not None and seg.size and now >= self._roll_at and self._broken is None:
                await self._commit.drain()
                seg = self._active
                if seg is not None and seg.size:
                    try:
                        self._roll_active(now)
                        # An empty active segment named after the next sequence number keeps
                        # the high-water mark on disk even if retention removes the rest.
                        self._start_segment(self._written_hwm + 1, now)
                    except OSError as exc:
                        self._log.error("segment_roll_failed", error=str(exc))
            self._chain.apply_retention(now, has_active=self._active is not None)
            if (not self._fsync and self.config.flush_secs and self._dirty_since is not None
                    and now - self._dirty_since >= self.config.flush_secs):
                self._commit.request()

    async def aclose(self) -> None:
        """Wait for pending appends, fsync everything, close the files. Idempotent."""
        if self._closed:
            return
        async with self._lock:
            self._closed = True
            await self._commit.drain()
            self._chain.trim(self._active)
            job = self._prepare_sync()
            try:
                if self._active is not None and self._active.index().fd >= 0:
                    job.fds.append(os.dup(self._active.index().fd))
                job.directory = self.directory
                await trio.to_thread.run_sync(job.run, limiter=self._env.limiter)
            except OSError as exc:
                self._log.error("final_sync_failed", error=str(exc))
            finally:
                job.close()
                self._chain.close()
                self._producers.close()
                self._wake.notify()

    def close_now(self) -> None:
        """Close the files without syncing (after a failed open, or in tests)."""
        self._closed = True
        self._chain.trim(self._active)
        self._chain.close()
        self._producers.close()
        self._wake.notify()
