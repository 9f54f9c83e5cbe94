"""One partition: an append-only sequence of segments in ``<data>/<topic>/<partition>/``."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import structlog
import trio
from trio.lowlevel import ParkingLot

from gateway.backend.completion import completed
from gateway.store.config import TopicConfig
from gateway.store.damage import (
    CORRUPT_SUFFIX,
    Damage,
    SegmentCheck,
    check_segment_file,
    clean_check,
)
from gateway.store.disk import FSYNC, DiskGuard, describe_fault, fault_kind
from gateway.store.durability import Durability, GroupCommit, SyncJob, Ticket
from gateway.store.errors import (
    BundleTooLarge,
    InvalidBundle,
    InvalidSequence,
    OutOfRange,
    SegmentCheckPending,
    StoreClosed,
    StoreError,
    StoreIOError,
)
from gateway.store.files import OpenFiles
from gateway.store.index import ENTRY_SIZE, read_index_file
from gateway.store.producers import (
    ProducerBatch,
    ProducerBudget,
    ProducerTable,
    StoredProducer,
)
from gateway.store.results import AppendResult, ReadResult
from gateway.store.scan import ScanError
from gateway.store.segment import MAX_REL_SEQ, LogSegment, Recovery, parse_segment_name
from gateway.store.syncer import NativeSyncer, Syncer
from gateway.store.tail import TailCache, TailEntry
from protocols.errors import ProtocolError
from protocols.tank.bundle import (
    SPARSE_FLAG,
    BundleInfo,
    Codec,
    decode_bundle,
    encode_bundle,
    validate_bundle,
)
from protocols.wire import UINT64_MAX, encode_varint, varint_size

log = structlog.get_logger("gateway.store")

#: Tank's minimum read: a Consume reads on to the bundle boundary past max(fetch_size, 32).
MIN_FETCH: Final = 32
#: In fsync durability, zeros are written this far ahead of the active segment's data
#: (topped up whenever fewer than PREFILL_LOW bytes are left); see LogSegment.prefill.
PREFILL_AHEAD: Final = 4 * 1024 * 1024
PREFILL_LOW: Final = 2 * 1024 * 1024
#: The largest sequence number a client may choose (a sparse bundle's, or ProduceWithSeqnum's
#: base): INT64_MAX, as Kafka's signed offsets. Beyond it a partition could take so few
#: further messages that one produce would block it for good.
MAX_CHOSEN_SEQ: Final = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class PartitionEnv:
    """What the store shares with its partitions."""

    durability: Durability
    max_bundle_size: int
    recovery_check_bytes: int
    #: Starts a background task in the store's nursery.
    spawn: Callable[..., Any]
    limiter: trio.CapacityLimiter
    #: Bounds the damage checks of rolled segments running in worker threads (their own
    #: limiter: a long check must not hold up topic creation or the final fsyncs).
    check_limiter: trio.CapacityLimiter
    #: Runs the fsyncs.
    syncer: Syncer | NativeSyncer
    #: Wall-clock seconds (segment names, retention, rolling by age).
    clock: Callable[[], float]
    #: Called with the seconds each group fsync took (metrics).
    observe_fsync: Callable[[float], None] | None = None
    #: Keeps the newest bundles in memory for the readers at the tail (None: off).
    tail: TailCache | None = None
    #: Bounds the rolled segment files open at once (None: no bound).
    files: OpenFiles | None = None
    #: When rolled segments are checked for damage: "lazy" (first read) or "startup".
    check_rolled: str = "lazy"
    #: A lazy check of a rolled segment up to this size runs at once, in the reader's
    #: call; a bigger one in a worker thread while the reader waits (SegmentCheckPending).
    inline_check_bytes: int = 64 * 1024
    #: Called with ``(messages, bytes)`` each time damage or a recovery cut loses data.
    on_data_loss: Callable[[int, int], None] | None = None
    #: The bound on idempotent producers remembered by all partitions together.
    producers: ProducerBudget | None = None
    #: The data directory's disk: free space, its floor, prefill, faults (None: unwatched).
    disk: DiskGuard | None = None


@dataclass(slots=True)
class _Written:
    """An append waiting for its fsync: what becomes visible once it is durable."""

    end: int
    last_seq: int
    size: int


#: ``(bundle, base_seq)``, or ``(bundle, base_seq, info)`` for a bundle the caller built,
#: or ``(bundle, base_seq, info, producer)`` for an idempotent producer's batch.
AppendEntry = (tuple[bytes, int | None] | tuple[bytes, int | None, BundleInfo | None]
               | tuple[bytes, int | None, BundleInfo | None, ProducerBatch | None])
AppendOutcome = AppendResult | StoreError


class _MustWait(Exception):
    """The next bundle needs the pending fsyncs drained first (a segment roll)."""

    def __init__(self) -> None:
        super().__init__("the pending fsyncs must finish first")
        self.outcomes: list[AppendOutcome] = []
        self.tickets: list[tuple[int, Ticket]] = []


@dataclass(slots=True)
class _Plan:
    first: int
    last: int
    data: bytes
    #: None, "create" (no active segment), "replace" (empty active with another base),
    #: or a roll reason.
    action: str | None


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
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._active: LogSegment | None = None
        self._hwm = 0
        self._written_hwm = 0
        #: Framed bytes made visible since the store opened (for Tank's minBytes).
        self.appended_bytes = 0
        self._changed = ParkingLot()
        self._waiters: set[trio.Event] = set()
        self._tail = env.tail.partition() if env.tail is not None and env.tail.budget else None
        self._lock = trio.Lock()
        #: Tasks of append_nowait spawned and not yet holding the lock.
        self._queued = 0
        self._commit = GroupCommit(env.syncer, prepare=self._prepare_sync,
                                   on_durable=self._on_durable, on_failure=self._on_sync_failed,
                                   observe=env.observe_fsync)
        self._sync_extra: list[int] = []
        self._producers = ProducerTable(directory, env.producers or ProducerBudget(1 << 62))
        self._dir_dirty = False
        self._unflushed_msgs = 0
        self._dirty_since: float | None = None
        self._roll_at = math.inf
        self._closed = False
        self._broken: str | None = None
        #: What the damage check found in each rolled segment, by segment base.
        self._checks: dict[int, SegmentCheck] = {}
        #: Checks running in a worker thread (set when done), and those that failed.
        self._checking: dict[int, trio.Event] = {}
        self._check_errors: dict[int, str] = {}
        self._log = log.bind(topic=topic, partition=index)

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

    # -- opening --------------------------------------------------------------------------------

    def load(self) -> None:
        """Open the partition's files, recovering the active segment. Blocking; runs once."""
        actives: list[tuple[int, str, int | None]] = []
        rolled: list[tuple[int, int, str, int | None]] = []
        for name in os.listdir(self.directory):
            if name.startswith("."):
                if name.endswith(".tmp"):
                    _unlink_quietly(os.path.join(self.directory, name))
                continue
            if name == "config" or name.endswith(CORRUPT_SUFFIX):
                continue  # a config, or bytes recovery cut off a segment (kept for people)
            parsed = parse_segment_name(name)
            if parsed is None:
                self._log.warning("unexpected_file_ignored", file=name)
            elif parsed.kind == "active":
                actives.append((parsed.base, name, parsed.ts))
            elif parsed.kind == "rolled":
                assert parsed.last is not None
                rolled.append((parsed.base, parsed.last, name, parsed.ts))
        segments: list[LogSegment] = []
        for base, last, name, ts in sorted(rolled):
            ts = ts if ts is not None else self._mtime(name)
            seg = LogSegment.open_rolled(self.directory, name, base, last, ts,
                                         self._env.files)
            if seg.size == 0 or last < base:
                self._log.error("bad_rolled_segment_ignored", segment=name, size=seg.size)
                seg.close()
                if last >= base:
                    self._report_damage(name, Damage(0, 0, base, last, "empty segment file"))
                continue
            if self._env.check_rolled == "startup":
                try:
                    self._finish_check(seg, self._run_check(seg))
                except OSError as exc:  # checked when first read instead
                    self._log.error("segment_check_failed", segment=name, error=str(exc))
            segments.append(seg)
        actives.sort()
        for i, (base, name, ts) in enumerate(actives):
            ts = ts if ts is not None else self._mtime(name)
            seg, report = LogSegment.recover_active(
                self.directory, name, base, ts, index_interval=self.config.index_interval_bytes,
                deep_check_bytes=self._env.recovery_check_bytes)
            self._report_recovery(name, report)
            if i == len(actives) - 1:
                self._active = seg
                if self._fsync:
                    seg.zeros = self._env.disk
                segments.append(seg)
            elif seg.last_seq is None:  # an older empty active segment: a stray
                seg.delete()
            else:  # more than one active segment: freeze the older ones
                seg.roll(int(self._env.clock()), self._env.files)
                seg.close_index()
                self._checks[seg.base] = clean_check(seg.base, seg.last_seq, seg.size)
                segments.append(seg)
                self._log.warning("extra_active_segment_rolled", segment=seg.name)
        segments.sort(key=lambda s: s.base)
        for prev, seg in itertools.pairwise(segments):
            if prev.last_seq is not None and seg.base <= prev.last_seq:
                self._log.error("segments_overlap", first=prev.name, second=seg.name)
        self._segments = segments
        self._bases = [s.base for s in segments]
        hwm = 0
        for seg in segments:
            hwm = max(hwm, seg.last_seq if seg.last_seq is not None else seg.base - 1)
        self._hwm = self._written_hwm = hwm
        self._producers.load(hwm)
        if self._active is not None:
            self._roll_at = self._roll_deadline(self._active.created_ts)

    def _mtime(self, name: str) -> int:
        return int(os.stat(os.path.join(self.directory, name)).st_mtime)

    def _report_recovery(self, name: str, report: Recovery) -> None:
        if report.prefill_trimmed:
            self._log.info("segment_prefill_trimmed", segment=name,
                           bytes=report.prefill_trimmed)
        if report.bytes_dropped or report.first_seq_lost is not None:
            self._log.warning("segment_tail_truncated", segment=name,
                              bytes_dropped=report.bytes_dropped, reason=report.reason,
                              bundles_kept=report.bundles,
                              first_seq_lost=report.first_seq_lost,
                              last_seq_lost=report.last_seq_lost,
                              last_seq_exact=report.last_seq_exact,
                              indexed_bytes_missing=report.indexed_past_end or None,
                              corrupt_file=report.corrupt_file)
            if report.corrupt_error is not None:
                self._log.error("corrupt_copy_failed", segment=name, error=report.corrupt_error)
            if self._env.on_data_loss is not None:
                first, last = report.first_seq_lost, report.last_seq_lost
                messages = last - first + 1 if first is not None and last is not None else 0
                self._env.on_data_loss(messages,
                                       report.bytes_dropped + report.indexed_past_end)
        if report.index_action:
            self._log.warning("segment_index_repaired", segment=name,
                              action=report.index_action)

    def _roll_deadline(self, created_ts: float) -> float:
        max_jitter = self.config.roll_jitter_secs
        jitter = random.uniform(0, max_jitter) if max_jitter else 0
        return created_ts + max(1.0, self.config.roll_secs - jitter)

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
        if self._lock.locked() or self._queued:
            self._append_later(entries, on_done)
            return
        if self.fast_append and not self._fsync and len(entries) == 1:
            result = self._append_plain_now(entries[0])
            if result is not None:
                on_done([result])
                return
        try:
            outcomes, tickets = self._write_all_now(entries)
        except _MustWait as wait:
            self._append_later(entries, on_done, wait.outcomes, wait.tickets)
            return
        _report_when_durable(outcomes, tickets, on_done)

    def _append_later(self, entries: Sequence[AppendEntry],
                      on_done: Callable[[list[AppendOutcome]], None],
                      written: list[AppendOutcome] | None = None,
                      tickets: list[tuple[int, Ticket]] | None = None) -> None:
        """Finish :meth:`append_nowait` in a task: the entries after ``written`` wait for
        the lock, and appends that come meanwhile queue behind them."""
        self._queued += 1
        self._env.spawn(self._append_in_task, entries, on_done, written or [], tickets or [])

    async def _append_in_task(self, entries: Sequence[AppendEntry],
                              on_done: Callable[[list[AppendOutcome]], None],
                              outcomes: list[AppendOutcome],
                              tickets: list[tuple[int, Ticket]]) -> None:
        async with self._lock:
            self._queued -= 1
            rest, rest_tickets = await self._write_all(entries[len(outcomes):])
        tickets = tickets + [(i + len(outcomes), t) for i, t in rest_tickets]
        _report_when_durable(outcomes + rest, tickets, on_done)

    async def _write_all(self, entries: Sequence[AppendEntry]
                         ) -> tuple[list[AppendOutcome], list[tuple[int, Ticket]]]:
        """Write every entry (the caller holds the lock), draining the pending fsyncs
        first where a segment must roll."""
        outcomes: list[AppendOutcome] = []
        tickets: list[tuple[int, Ticket]] = []
        while True:
            try:
                done, more = self._write_all_now(entries[len(outcomes):])
            except _MustWait as wait:
                done, more = wait.outcomes, wait.tickets
                await self._commit.drain()
            tickets += [(i + len(outcomes), t) for i, t in more]
            outcomes += done
            if len(outcomes) == len(entries):
                return outcomes, tickets

    def _write_all_now(self, entries: Sequence[AppendEntry]
                       ) -> tuple[list[AppendOutcome], list[tuple[int, Ticket]]]:
        """Write entries until one needs the pending fsyncs drained first (then raise
        :class:`_MustWait` carrying what was written so far)."""
        outcomes: list[AppendOutcome] = []
        tickets: list[tuple[int, Ticket]] = []
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
                except _MustWait as wait:
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
        if self._lock.locked() or self._queued or self._fsync or not self.fast_append:
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
            self._tail.add(TailEntry(first, last, False, seg, offset, prefix, bundle))
        seg.visible_size = seg.size
        self._hwm = last
        self.appended_bytes += framed
        self._changed.unpark_all()
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for event in waiters:
                event.set()
        self._count_unflushed(msg_count, now)
        return AppendResult(first, last, framed)

    def _check_bundle(self, bundle: bytes) -> BundleInfo:
        if len(bundle) > self._env.max_bundle_size:
            raise BundleTooLarge(f"bundle of {len(bundle)} bytes is over the "
                                 f"{self._env.max_bundle_size} byte limit")
        try:
            return validate_bundle(bundle)
        except ProtocolError as exc:
            raise InvalidBundle(str(exc)) from None

    def _write_now(self, bundle: bytes, base_seq: int | None, info: BundleInfo | None = None,
                   producer: ProducerBatch | None = None
                   ) -> tuple[AppendResult, Ticket | None]:
        """Validate (unless ``info`` vouches for the bundle), plan and write one bundle
        (and, for an idempotent producer's batch, its producer state record first).

        Raises :class:`_MustWait` when the bundle needs a new segment while appends still
        wait for their fsync: every non-durable byte stays in the active segment.
        """
        if info is None:
            info = self._check_bundle(bundle)
        elif len(bundle) > self._env.max_bundle_size:
            raise BundleTooLarge(f"bundle of {len(bundle)} bytes is over the "
                                 f"{self._env.max_bundle_size} byte limit")
        if base_seq == 0:
            base_seq = None  # Tank: an explicit first sequence of 0 means "not given"
        self._check_usable()
        now = self._env.clock()
        plan = self._plan(info, bundle, base_seq, now)
        if plan.action and self._active is not None and self._commit.pending:
            raise _MustWait()
        return self._execute(plan, info.msg_count, now, producer)

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosed(f"partition {self.topic}/{self.index} is closed")
        if self._broken is not None:
            raise StoreIOError(f"partition {self.topic}/{self.index} failed: {self._broken}; "
                               "reopen the store to recover it")

    def _plan(self, info: BundleInfo, bundle: bytes, base_seq: int | None, now: float) -> _Plan:
        hwm = self._written_hwm
        if info.sparse:
            assert info.first_seq is not None and info.last_seq is not None
            first, last = info.first_seq, info.last_seq
            if base_seq is not None and base_seq != first:
                raise InvalidSequence(f"base sequence {base_seq} differs from the sparse "
                                      f"bundle's first sequence {first}")
        else:
            first = hwm + 1 if base_seq is None else base_seq
            last = first + info.msg_count - 1
        if first <= hwm:
            raise InvalidSequence(f"first sequence {first} is not above the "
                                  f"high-water mark {hwm}")
        if last > MAX_CHOSEN_SEQ and (info.sparse or base_seq is not None):
            self._log.warning("produce_sequence_refused", first_seq=first, last_seq=last,
                              max_seq=MAX_CHOSEN_SEQ)
            raise InvalidSequence(f"sequence number {last} is over {MAX_CHOSEN_SEQ}, the "
                                  "largest a producer may choose")
        if last >= UINT64_MAX:
            raise InvalidSequence(f"sequence number {last} out of range")
        action = self._segment_action(first, last, varint_size(len(bundle)) + len(bundle), now)
        if not info.sparse and first != hwm + 1 and action is None:
            # A plain bundle's sequence numbers are implicit (counted from the previous
            # bundle), so one that leaves a gap is stored sparse, unless it opens a
            # segment whose base names its first sequence number.
            data = self._as_sparse(bundle, first, info.codec)
            action = self._segment_action(first, last, varint_size(len(data)) + len(data), now)
            if action is None:
                return _Plan(first, last, data, None)
        return _Plan(first, last, bundle, action)

    def _segment_action(self, first: int, last: int, framed: int, now: float) -> str | None:
        seg = self._active
        if seg is None:
            return "create"
        if seg.size == 0:
            return None if seg.base == first else "replace"
        if seg.size + framed > self.config.segment_bytes:
            return "size"
        if seg.index().size_bytes + ENTRY_SIZE > self.config.index_max_bytes:
            return "index full"
        if last - seg.base > MAX_REL_SEQ:
            return "sequence range"
        if now >= self._roll_at:
            return "age"
        return None

    def _as_sparse(self, bundle: bytes, first: int, codec: Codec) -> bytes:
        messages = decode_bundle(bundle, first)
        data = encode_bundle(messages, codec=codec, sparse=True)
        if len(data) > self._env.max_bundle_size:
            raise BundleTooLarge("bundle over the size limit once stored sparse")
        return data

    def _execute(self, plan: _Plan, msg_count: int, now: float,
                 producer: ProducerBatch | None = None
                 ) -> tuple[AppendResult, Ticket | None]:
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
        try:
            if plan.action == "replace":
                self._drop_empty_active()
            elif plan.action not in (None, "create"):
                self._roll_active(now)
            if self._active is None:
                self._start_segment(plan.first, now)
                self._apply_retention(now)  # Tank applies retention when a segment rolls
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
            self._prefill(seg)
        if self._tail is not None:
            self._tail.add(TailEntry(plan.first, plan.last, bool(plan.data[0] & SPARSE_FLAG),
                                     seg, offset, prefix, plan.data))
        result = AppendResult(plan.first, plan.last, size)
        if self._fsync:
            return result, self._commit.add(_Written(seg.size, plan.last, size))
        self._publish(seg.size, plan.last, size)
        self._count_unflushed(msg_count, now)
        return result, None

    def _prefill(self, seg: LogSegment) -> None:
        """Keep zeros :data:`PREFILL_AHEAD` bytes ahead of the active segment's data (up to
        its roll size): the fsyncs of appends into them need no journal commit. Only from
        the space the disk's guard allows (above the floor, within the bound of all
        prefill together)."""
        up_to = min(seg.size + PREFILL_AHEAD, max(self.config.segment_bytes, seg.size))
        disk = self._env.disk
        if disk is not None:
            up_to = seg.prefilled + disk.prefill_room(up_to - seg.prefilled)
        if up_to <= seg.prefilled:
            return
        try:
            seg.prefill(up_to)
        except OSError as exc:  # only a missed speed-up: appends work without it
            if disk is not None:
                disk.failed("prefill", exc, record=False, topic=self.topic,
                            partition=self.index, segment=seg.name)
            else:
                self._log.warning("segment_prefill_failed", segment=seg.name, error=str(exc))

    def hand_back_zeros(self) -> int:
        """Cut the zeros written ahead of the active segment (space is short); the bytes
        given back. The next appends prefill again only as the disk's guard allows."""
        seg = self._active
        if seg is None or not seg.file_open or seg.prefilled <= seg.size:
            return 0
        held = seg.prefilled - seg.size
        try:
            seg.trim()
        except OSError as exc:
            self._log.warning("segment_trim_failed", segment=seg.name, error=str(exc))
            return 0
        return held

    def _failed(self, operation: str, exc: OSError, **where: Any) -> StoreIOError:
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
        self._notify()

    def _notify(self) -> None:
        self._changed.unpark_all()
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for event in waiters:
                event.set()

    # -- segments ---------------------------------------------------------------------------------

    def _start_segment(self, base: int, now: float) -> None:
        seg = LogSegment.create(self.directory, base, int(now))
        if self._fsync:
            seg.zeros = self._env.disk
        self._segments.append(seg)
        self._bases.append(base)
        self._active = seg
        self._dir_dirty = True
        self._roll_at = self._roll_deadline(seg.created_ts)

    def _drop_empty_active(self) -> None:
        seg = self._active
        assert seg is not None and seg.size == 0
        self._remove(seg)
        seg.delete()
        self._active = None
        self._dir_dirty = True

    def _remove(self, seg: LogSegment) -> None:
        i = self._segments.index(seg)
        del self._segments[i]
        del self._bases[i]
        self._checks.pop(seg.base, None)

    def _roll_active(self, now: float) -> None:
        """Freeze the active segment as ``.ilog``; the caller starts the next one."""
        seg = self._active
        assert seg is not None
        if seg.size == 0:
            self._drop_empty_active()
            return
        to_sync: list[int] = []
        try:
            to_sync.append(os.dup(seg.fd))
            index_fd = seg.index().fd
            if index_fd >= 0:
                to_sync.append(os.dup(index_fd))
        except OSError:
            pass  # the data was synced already in fsync mode; an unsynced index is rebuilt
        try:
            seg.roll(int(now), self._env.files)
        except OSError:
            for fd in to_sync:
                os.close(fd)
            raise
        seg.close_index()
        assert seg.last_seq is not None
        self._checks[seg.base] = clean_check(seg.base, seg.last_seq, seg.size)
        self._active = None
        self._sync_extra.extend(to_sync)
        self._dir_dirty = True
        self._roll_at = math.inf
        self._log.info("segment_rolled", segment=seg.name, size=seg.size)
        if not self._fsync:
            self._commit.request()

    def _apply_retention(self, now: float) -> None:
        cfg = self.config
        if cfg.cleanup_policy != "delete":
            return
        rolled = [s for s in self._segments if s.rolled]
        if self._active is None and rolled:
            rolled.pop()  # keep a segment on disk: it carries the high-water mark
        total = sum(s.size for s in rolled)
        while rolled:
            seg = rolled[0]
            if cfg.retention_segments and len(rolled) > cfg.retention_segments:
                reason = "retention.segments.count"
            elif cfg.retention_bytes and total > cfg.retention_bytes:
                reason = "log.retention.bytes"
            elif (cfg.retention_secs and seg.rolled_ts is not None
                  and seg.rolled_ts + cfg.retention_secs < now):
                reason = "log.retention.secs"
            else:
                break
            rolled.pop(0)
            total -= seg.size
            self._remove(seg)
            name = seg.name
            seg.delete()
            self._dir_dirty = True
            self._log.info("segment_deleted", segment=name, reason=reason)

    # -- durability --------------------------------------------------------------------------

    def _prepare_sync(self) -> SyncJob:
        job = SyncJob()
        job.fds, self._sync_extra = self._sync_extra, []
        producers_fd = self._producers.sync_fd()
        if producers_fd is not None:
            job.fds.append(producers_fd)
        if self._producers.renamed:
            self._producers.renamed = False
            self._dir_dirty = True
        seg = self._active
        if seg is not None and seg.file_open:
            job.fds.append(os.dup(seg.fd))
        if self._dir_dirty:
            self._dir_dirty = False
            job.directory = self.directory
        self._dirty_since = None
        return job

    def _on_durable(self, payloads: Sequence[_Written]) -> None:
        disk = self._env.disk
        if disk is not None and disk.fault is not None:
            disk.synced()
        if payloads:
            self._publish(payloads[-1].end, payloads[-1].last_seq,
                          sum(p.size for p in payloads))

    def _on_sync_failed(self, error: OSError, payloads: Sequence[_Written]) -> None:
        if self._env.disk is not None:
            self._env.disk.failed(FSYNC, error, topic=self.topic, partition=self.index,
                                  appends_failed=len(payloads))
        else:
            self._log.error("fsync_failed", error=str(error), appends_failed=len(payloads))
        if not payloads:
            return
        seg = self._active
        assert seg is not None
        if self._tail is not None:
            self._tail.clear()
        try:
            seg.truncate(seg.visible_size, self._hwm if seg.visible_size else None)
        except OSError as exc:
            self._broken = f"cannot cut back unsynced bundles: {exc}"
            self._log.error("partition_broken", error=str(exc))
        self._written_hwm = self._hwm
        try:
            self._producers.cut(self._hwm)
        except OSError as exc:
            self._broken = f"cannot cut back producer state records: {exc}"
            self._log.error("partition_broken", error=str(exc))

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
        cached = self._tail.find(seq, hwm) if self._tail is not None else None
        if cached is not None:
            return self._read_cached(seq, cached, max(fetch_size, MIN_FETCH), hwm,
                                     first_available)
        wanted = seq
        for attempt in (0, 1):
            where = self._readable(seq, hwm)
            if where is None:  # lost up to the high-water mark: wait for appends, as at the tail
                return ReadResult(seq=wanted, base_seq=wanted, first_bundle_sparse=False,
                                  high_water_mark=hwm, first_available=first_available,
                                  next_seq=wanted)
            seg, seq, limit, limit_last, check = where
            try:
                found = seg.locate(seq, limit, limit_last)
                if found is None:
                    raise ScanError(limit, f"sequence {seq} not found")
                offset, base_seq, sparse = found
                end, next_seq = seg.chunk_end(offset, base_seq,
                                              offset + max(fetch_size, MIN_FETCH), limit,
                                              (limit_last or 0) + 1)
                file = seg.acquire_file()
            except ScanError as exc:
                failure: Exception = exc
                if attempt == 0:
                    self._log.error("segment_index_suspect", segment=seg.name, error=str(exc))
                    try:
                        if check is not None and not check.clean:  # the check's entries
                            seg.use_index(check.rels, check.offsets)
                        else:
                            seg.rebuild_index(self.config.index_interval_bytes)
                    except (ScanError, OSError) as again:
                        failure = again
                    else:
                        seq = wanted
                        continue
                self._log.error("segment_read_failed", segment=seg.name, error=str(failure))
                raise StoreIOError(f"{seg.name}: {failure}") from None
            except OSError as exc:
                self._log.error("segment_read_failed", segment=seg.name, error=str(exc))
                raise StoreIOError(f"{seg.name}: {exc}") from exc
            return ReadResult(seq=wanted, base_seq=base_seq, first_bundle_sparse=sparse,
                              high_water_mark=hwm, first_available=first_available,
                              file=file, offset=offset, length=end - offset,
                              next_seq=next_seq)
        raise AssertionError("unreachable")  # pragma: no cover

    def _readable(self, seq: int, hwm: int
                  ) -> tuple[LogSegment, int, int, int | None, SegmentCheck | None] | None:
        """Where to read ``seq``: ``(segment, sequence to read from, byte limit, last
        sequence before the limit, the segment's check)``. A sequence in a damaged region
        moves on to the next readable one (this segment's next extent, or a later
        segment's base); None when nothing readable follows up to ``hwm``. Raises
        :class:`SegmentCheckPending` when a segment must be checked first."""
        segments = self._segments
        i = max(bisect_right(self._bases, seq) - 1, 0)
        while i < len(segments) - 1 and (segments[i].last_seq or 0) < seq:
            i += 1
        while True:
            seg = segments[i]
            if not seg.rolled:
                return seg, seq, seg.visible_size, hwm, None
            check = self._checked(seg)
            if check.clean:
                return seg, seq, seg.visible_size, seg.last_seq, check
            extent = check.extent_for(seq)
            if extent is not None:
                return seg, max(seq, extent.first_seq), extent.end, extent.last_seq, check
            i += 1
            if i == len(segments) or segments[i].base > hwm:
                return None
            seq = segments[i].base

    # -- damage checks of rolled segments ----------------------------------------------------

    def _checked(self, seg: LogSegment) -> SegmentCheck:
        """The damage check of rolled ``seg``: made now if small, else started in a
        worker thread (raises :class:`SegmentCheckPending`)."""
        check = self._checks.get(seg.base)
        if check is not None:
            return check
        error = self._check_errors.pop(seg.base, None)
        if error is not None:  # the last attempt failed: say so once, try again next time
            raise StoreIOError(f"{seg.name}: cannot check the segment: {error}")
        if seg.size > self._env.inline_check_bytes:
            if seg.base not in self._checking:
                done = self._checking[seg.base] = trio.Event()
                self._env.spawn(self._check_in_thread, seg, done)
            raise SegmentCheckPending(f"{seg.name} is being checked")
        try:
            check = self._run_check(seg)
        except OSError as exc:
            self._log.error("segment_check_failed", segment=seg.name, error=str(exc))
            raise StoreIOError(f"{seg.name}: cannot check the segment: {exc}") from exc
        self._finish_check(seg, check)
        return check

    async def _check_in_thread(self, seg: LogSegment, done: trio.Event) -> None:
        try:
            # Abandoned at shutdown: the thread reads its own descriptor to the end.
            check = await trio.to_thread.run_sync(self._run_check, seg,
                                                  limiter=self._env.check_limiter,
                                                  abandon_on_cancel=True)
        except OSError as exc:
            self._log.error("segment_check_failed", segment=seg.name, error=str(exc))
            self._check_errors[seg.base] = str(exc)
        else:
            if seg in self._segments:  # not removed by retention meanwhile
                self._finish_check(seg, check)
        finally:
            del self._checking[seg.base]
            done.set()

    def _run_check(self, seg: LogSegment) -> SegmentCheck:
        """Check ``seg``'s file (blocking: in a worker thread when it is big). Touches only
        what a rolled segment never changes."""
        assert seg.last_seq is not None
        rels, offsets, _ = read_index_file(seg.index_path)
        return check_segment_file(seg.path, seg.base, seg.last_seq, index_rels=rels,
                                  index_offsets=offsets,
                                  interval=self.config.index_interval_bytes)

    def _finish_check(self, seg: LogSegment, check: SegmentCheck) -> None:
        """Keep ``check``, read ``seg`` through its index entries, report its damage."""
        self._checks[seg.base] = check
        seg.use_index(check.rels, check.offsets, write=check.clean)
        for damage in check.damage:
            self._report_damage(seg.name, damage)

    def _report_damage(self, segment: str, damage: Damage) -> None:
        """One ``data_loss`` line and the data-loss metrics for a damaged region."""
        self._log.error("data_loss", segment=segment, first_seq=damage.first_lost,
                        last_seq=damage.last_lost, messages=damage.lost_range,
                        bytes=damage.size, offset=damage.offset, reason=damage.reason)
        if self._env.on_data_loss is not None:
            self._env.on_data_loss(damage.lost_range, damage.size)

    async def wait_checks(self) -> None:
        """Wait for the damage checks running in worker threads (see
        :class:`SegmentCheckPending`)."""
        while self._checking:
            await next(iter(self._checking.values())).wait()

    @property
    def damage(self) -> list[tuple[str, Damage]]:
        """``(segment name, damage)`` of every damaged region found so far."""
        return [(seg.name, d) for seg in self._segments
                if (c := self._checks.get(seg.base)) is not None for d in c.damage]

    @staticmethod
    def _read_cached(seq: int, entries: list[TailEntry], target: int, hwm: int,
                     first_available: int) -> ReadResult:
        """A read served from the tail cache: the same range :meth:`read` would give."""
        parts: list[bytes] = []
        size = 0
        for entry in entries:
            parts += (entry.prefix, entry.bundle)
            size += entry.size
            if size >= target:
                break
        first = entries[0]
        return ReadResult(seq=seq, base_seq=first.first_seq, first_bundle_sparse=first.sparse,
                          high_water_mark=hwm, first_available=first_available,
                          offset=first.offset, length=size, next_seq=entry.last_seq + 1,
                          parts=parts)

    # -- waiting --------------------------------------------------------------------------------

    async def wait_for(self, seq: int, deadline: float = math.inf) -> bool:
        """Park until ``high_water_mark >= seq`` or the trio clock reaches ``deadline``.

        Returns whether the high-water mark got there. Wakes right after the append
        that makes ``seq`` visible. An idle waiter costs nothing but its parked task.
        Returns False at once if the partition is closed.
        """
        with trio.move_on_at(deadline):
            while self._hwm < seq and not self._closed:
                await self._changed.park()
        return self._hwm >= seq

    async def wait_changed(self) -> None:
        """Park until the next visible append (or close). Every reader of the partition
        that waits parks in one lot, woken together."""
        await self._changed.park()

    def add_waiter(self, event: trio.Event) -> None:
        """Set ``event`` at the next visible append (or close). One event can wait on many
        partitions this way, with no task per partition; see :meth:`remove_waiter`."""
        self._waiters.add(event)

    def remove_waiter(self, event: trio.Event) -> None:
        """Forget ``event`` (after a wait that ended otherwise)."""
        self._waiters.discard(event)

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
            self._apply_retention(now)
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
            self._trim_active()
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
                for seg in self._segments:
                    seg.close()
                self._producers.close()
                self._notify()

    def close_now(self) -> None:
        """Close the files without syncing (after a failed open, or in tests)."""
        self._closed = True
        self._trim_active()
        for seg in self._segments:
            seg.close()
        self._producers.close()
        self._notify()


    def _trim_active(self) -> None:
        """Leave the active segment ending with its data (a Tank broker reads it so)."""
        if self._active is not None and self._active.file_open:
            try:
                self._active.trim()
            except OSError as exc:  # recovery trims the zeros at the next start
                self._log.warning("segment_trim_failed", segment=self._active.name,
                                  error=str(exc))


def _varint(n: int) -> bytes:
    """:func:`~protocols.wire.encode_varint` with the usual sizes unrolled."""
    if n < 0x4000:
        return bytes((n,)) if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14))
    return encode_varint(n)


def _report_when_durable(outcomes: list[AppendOutcome], tickets: list[tuple[int, Ticket]],
                         on_done: Callable[[list[AppendOutcome]], None]) -> None:
    """Call ``on_done(outcomes)`` once the appends behind ``tickets`` are durable, with a
    failed fsync's error in their place. Rounds resolve tickets in order, so the last
    ticket resolving means they all have."""
    if not tickets:
        on_done(outcomes)
        return

    def resolved(last: Ticket) -> None:
        for i, ticket in tickets:
            if ticket.failed:
                error = ticket.error
                kind = fault_kind(error) if isinstance(error, OSError) else "io_error"
                outcomes[i] = StoreIOError(f"{describe_fault(kind)}: fsync failed: {error}",
                                           kind)
        on_done(outcomes)

    tickets[-1][1].on_resolved = resolved


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
