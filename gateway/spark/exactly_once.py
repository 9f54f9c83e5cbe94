"""Exactly-once streaming writes: a replayed micro-batch appends nothing twice.

Spark replays a micro-batch whose end it did not record (the driver died, a task
failed and was retried): the same input offsets, so the same rows. Every attempt of a
task writes through the protocol below, so that whatever an earlier attempt of the
same task wrote (all of it, part of it, or a produce still on its way from a process
the driver left behind) stays, and what it did not write is written once.

A task's output is cut into *pieces*: per target partition, the rows buffered when a
flush happens (``batchMessages`` / ``batchBytes``, or the end of the task), numbered
0, 1, ... per partition. Each piece is one bundle, written atomically, placed with
ProduceWithSeqnum at a sequence number the writer chose: the partition refuses it
(Tank code 10) when anything is already there. One flush goes in rounds:

1. read the target partitions' high-water marks;
2. read the intents (:mod:`gateway.spark.ledger`) the query's attempts appended since
   this task last looked, and, for each piece an *earlier attempt of this task*
   intended, whether the target holds exactly its messages (digest of keys and
   values) at the sequence number it named: if so, that piece is written;
3. append an intent naming, for each piece still to write, ``high-water mark + 1``,
   and wait for it to be stored;
4. ProduceWithSeqnum those pieces at those sequence numbers. A piece refused with
   code 10 (another writer got there first) goes to the next round.

Why no piece lands twice: of two attempts that both produce a piece, say A first, B's
produce can only succeed at a sequence number above the high-water mark it read in
step 1, and that mark is already past A's piece (had B read it before A's produce, B's
number would be at most A's, and the partition would refuse one of them). So B read
the mark after A's produce, hence after A's intent was stored, and saw A's piece in
step 2. The same holds for a task of a crashed driver that writes late.

Without a partition column, a keyless row goes to partition ``(batch + task) %
partitions``, whatever the rows' order; keyed rows by ``crc32(key)``, with the
partition count the task's first attempt used. A replay must give each task the same
rows (Spark's offsets do, for a deterministic query). When a task's output for a
partition fits one flush, the order of its rows does not matter; when it took several
and the first attempt wrote only some, the replay must produce the same pieces: a
written piece whose digest differs from the replay's raises :class:`ReplayMismatch`
rather than write a row twice or lose one.

The driver's ``commit`` appends a commit record; a task of a batch that was committed
already (Spark replays the last batch when its own commit log lacks it) writes
nothing, without looking at the target.
"""

from __future__ import annotations

import hashlib
import operator
import random
import time
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.client.errors import BoundaryError, ProduceFailed, UnknownTopicError
from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.ledger import Commit, Intent, Ledger, Piece, topic_name
from gateway.spark.options import TankOptions
from gateway.spark.producer import Producer, WriteFailed, WriteReport, describe
from protocols.tank.bundle import Message

#: Tank's Produce code for a sequence number at or below the high-water mark.
INVALID_SEQUENCE: Final = 10
#: Rounds of one flush before giving up on a partition other writers keep appending to.
MAX_ROUNDS: Final = 64
#: The pause before round n is random, up to ``min(MAX_BACKOFF, BACKOFF * 2**n)``.
BACKOFF: Final = 0.002
MAX_BACKOFF: Final = 0.1
_FETCH: Final = 1024 * 1024


class ReplayMismatch(WriteFailed):
    """A replayed task's rows differ from what its first attempt wrote in part."""


@dataclass(frozen=True, slots=True)
class TaskIdentity:
    """Which write this task attempt is: query, run, micro-batch, task, attempt."""

    query_id: str
    run_id: str
    batch: int
    task: int
    attempt: str

    @classmethod
    def current(cls) -> TaskIdentity:
        """From the running Spark task (Spark sets the query and batch ids as local
        properties of every micro-batch's jobs; the job group is the run id)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if context is None or not query or batch is None:
            raise WriteFailed("exactly-once writes need a micro-batch streaming query "
                              "(Spark names its query and batch to the tasks); set "
                              "exactlyOnce=false otherwise")
        run = context.getLocalProperty("spark.jobGroup.id") or ""
        # Task attempt ids start again at 0 in a restarted driver: a random part keeps a
        # replay's attempt from taking the dead one's intents for its own.
        return cls(query, run, int(batch), context.partitionId(),
                   f"{context.taskAttemptId()}-{uuid.uuid4().hex}")


def digest(messages: Sequence[Message]) -> str:
    """What identifies a piece: its keys and values, in order (not the timestamps: a
    row without one gets the time of the write)."""
    keys = list(map(_KEY, messages))
    values = list(map(_VALUE, messages))
    h = hashlib.blake2b(digest_size=16)
    h.update(array("q", map(len, values)).tobytes())
    h.update(b"".join(values))
    missing = keys.count(None)
    if missing == len(keys):
        h.update(b"no keys")
    else:
        h.update(array("q", map(len, keys) if not missing else
                       [-1 if k is None else len(k) for k in keys]).tobytes())
        h.update(b"".join(k for k in keys if k) if missing else b"".join(keys))
    return h.hexdigest()


_KEY: Final = operator.attrgetter("key")
_VALUE: Final = operator.attrgetter("value")


class OnceProducer(Producer):
    """:class:`~gateway.spark.producer.Producer` with the exactly-once protocol."""

    def __init__(self, options: TankOptions, client: BlockingTankClient,
                 task: TaskIdentity) -> None:
        super().__init__(options, client)
        self.task = task
        self.ledger = Ledger(client, topic_name(options.commit_topic_prefix, task.query_id))
        self.ledger.ensure()
        last = self.ledger.last_commit()
        #: The batch was committed: a replay Spark makes of it writes nothing.
        self.committed = last is not None and last.batch >= task.batch
        self._cursor = last.intents_end + 1 if last is not None else 1
        #: Pieces earlier attempts of this task intended, by (partition, index).
        self._earlier: dict[tuple[int, int], list[Piece]] = {}
        self._earlier_totals: list[dict[int, int]] = []
        self._verdicts: dict[tuple[int, int, str], bool] = {}
        self._complete: set[int] = set()
        self._indexes: dict[int, int] = {}
        self.skipped = 0
        if self.committed:
            return
        adopted = self._read_intents()
        if adopted is not None:
            self.partition_count = adopted
        self._sticky = (task.batch + task.task) % self.partition_count

    def flush(self, final: bool = False) -> None:
        pieces = {}
        for p, msgs in self.pending.items():
            index = self._indexes.get(p, 0)
            self._indexes[p] = index + 1
            pieces[p] = (index, msgs, digest(msgs))
        self.pending = {}
        self.pending_count = self.pending_bytes = 0
        totals = dict(self._indexes) if final else None
        if pieces:
            self._deliver(pieces, totals)
        elif totals:
            self.ledger.append_intent(self._intent((), totals))

    def finish(self) -> WriteReport:
        if not self.committed:
            self.flush(final=True)
        return WriteReport(self.counts, self.skipped, self.task.query_id, self.task.run_id)

    # -- the rounds of one flush ---------------------------------------------------------

    def _deliver(self, pieces: dict[int, tuple[int, list[Message], str]],
                 totals: dict[int, int] | None) -> None:
        todo = dict(pieces)
        refused: dict[int, int] = {}
        for round_ in range(MAX_ROUNDS):
            if round_:
                time.sleep(random.uniform(0, min(MAX_BACKOFF, BACKOFF * 2 ** round_)))
            marks = self._high_water_marks(sorted(todo))
            for p, first in refused.items():
                if marks[p] < first:
                    raise WriteFailed(
                        f"{self.options.endpoint} refused messages at sequence {first} of "
                        f"{self.options.topic}/{p} although its high-water mark is "
                        f"{marks[p]}: it does not let a writer choose sequence numbers "
                        "(ProduceWithSeqnum; e.g. a gateway in upstream-Kafka mode), which "
                        "exactly-once writes need; exactlyOnce=false writes at least once")
            self._read_intents()
            for p in sorted(todo):
                index, msgs, wanted = todo[p]
                if self._written(p, index, wanted, marks[p]):
                    self.skipped += len(msgs)
                    del todo[p]
            if not todo:
                return
            places = {p: marks[p] + 1 for p in todo}
            self.ledger.append_intent(self._intent(
                [Piece(p, todo[p][0], places[p], len(todo[p][1]), todo[p][2]) for p in todo],
                totals))
            try:
                self.client.produce_with_seqnum(
                    {(self.options.topic, p): (places[p], todo[p][1]) for p in todo},
                    codec=self.options.codec)
                failed: dict[int, int] = {}
            except ProduceFailed as exc:
                failed = {p: code for (_, p), code in exc.errors.items()}
                others = {k: c for k, c in exc.errors.items() if c != INVALID_SEQUENCE}
                if others:
                    raise WriteFailed(describe(self.options, ProduceFailed(others))) from None
            for p in list(todo):
                if p not in failed:
                    self.counts[p] = self.counts.get(p, 0) + len(todo.pop(p)[1])
            refused = {p: places[p] for p in failed}
            if not todo:
                return
        raise WriteFailed(
            f"could not place messages in {self.options.topic} partitions {sorted(todo)} in "
            f"{MAX_ROUNDS} tries: other writers kept appending to them first")

    def _intent(self, pieces: Sequence[Piece], totals: dict[int, int] | None) -> Intent:
        return Intent(self.task.batch, self.task.task, self.task.attempt,
                      self.partition_count, tuple(pieces), totals)

    def _high_water_marks(self, partitions: list[int]) -> dict[int, int]:
        try:
            bounds = self.client.discover_partitions(self.options.topic, partitions)
        except UnknownTopicError:
            return dict.fromkeys(partitions, 0)  # the first produce creates it
        return {b.partition: b.high_water_mark for b in bounds}

    def _read_intents(self) -> int | None:
        """Take in the intents appended since the last look; the partition count of the
        first earlier attempt of this task seen, if any."""
        found, self._cursor = self.ledger.intents(self._cursor)
        adopted = None
        for intent in found:
            if (intent.batch, intent.task) != (self.task.batch, self.task.task) \
                    or intent.attempt == self.task.attempt:
                continue
            adopted = adopted or intent.partitions
            for piece in intent.pieces:
                self._earlier.setdefault((piece.partition, piece.index), []).append(piece)
            if intent.totals:
                self._earlier_totals.append(dict(intent.totals))
        return adopted

    # -- what earlier attempts wrote -----------------------------------------------------

    def _written(self, partition: int, index: int, wanted: str, mark: int) -> bool:
        """Whether an earlier attempt wrote piece ``index`` for ``partition`` (raises
        :class:`ReplayMismatch` when it wrote other rows and not all of its pieces)."""
        if partition in self._complete:
            return True
        for piece in self._earlier.get((partition, index), ()):
            if self._present(piece, mark):
                if piece.digest != wanted and not self._all_written(partition, mark):
                    raise ReplayMismatch(
                        f"batch {self.task.batch}, task {self.task.task}: an earlier attempt "
                        f"wrote piece {index} of its rows for {self.options.topic}/"
                        f"{partition} with other rows than this one, and not all of its "
                        "pieces: the query does not give a replayed task the same rows in "
                        "the same order, so it can not be completed exactly once")
                return True
        return self._all_written(partition, mark)

    def _all_written(self, partition: int, mark: int) -> bool:
        """Whether an earlier attempt wrote each of its pieces for ``partition``."""
        for totals in self._earlier_totals:
            count = totals.get(partition)
            if count is None:
                continue
            if all(any(self._present(piece, mark)
                       for piece in self._earlier.get((partition, i), ()))
                   for i in range(count)):
                self._complete.add(partition)
                return True
        return False

    def _present(self, piece: Piece, mark: int) -> bool:
        """Whether the target holds exactly ``piece``'s messages at its place."""
        key = (piece.partition, piece.first, piece.digest)
        known = self._verdicts.get(key)
        if known is not None:
            return known
        if piece.first > mark:
            return False  # not there yet: its produce may still land (then ours can not)
        if piece.first + piece.count - 1 > mark:
            verdict = False  # something else holds its first place
        else:
            verdict = self._read_digest(piece) == piece.digest
        self._verdicts[key] = verdict
        return verdict

    def _read_digest(self, piece: Piece) -> str | None:
        """The digest of the ``piece.count`` messages from ``piece.first`` (None when
        they are not all there)."""
        end = piece.first + piece.count
        seq = piece.first
        found: list[Message] = []
        while seq < end:
            try:
                result = self.client.consume(self.options.topic, piece.partition, seq,
                                             fetch_size=_FETCH)
            except BoundaryError as exc:
                if exc.first_available > seq:
                    # Removed by retention since: the place was taken, by this piece as
                    # far as anyone can tell now.
                    return piece.digest
                return None
            got = [m for m in result.messages if seq <= m.seq < end]
            if not got or got[0].seq != seq or got[-1].seq != seq + len(got) - 1:
                return None  # a gap: not one bundle of this writer's
            found.extend(got)
            seq += len(got)
        return digest(found)


def record_commit(options: TankOptions, messages: Sequence[Any], batch: int) -> Commit | None:
    """On the driver, after every task of ``batch`` succeeded: append its commit record
    (so a replay of the batch writes nothing). None when no task reported a query."""
    reports = [m for m in messages if isinstance(m, WriteReport) and m.query_id]
    if not reports:
        return None
    first = reports[0]
    with BlockingTankClient(options.host, options.port, **options.client_options()) as client:
        ledger = Ledger(client, topic_name(options.commit_topic_prefix, first.query_id))
        ledger.ensure()
        _, intents_end = ledger.ends()
        commit = Commit(batch, first.run_id, intents_end,
                        written=sum(sum(r.counts.values()) for r in reports),
                        skipped=sum(r.skipped for r in reports))
        ledger.append_commit(commit)
        return commit
