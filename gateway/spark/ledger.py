"""The commit topic of an exactly-once streaming write: what each attempt wrote where.

One topic per streaming query, ``<commitTopicPrefix>-<query id>`` (the id Spark keeps in
the checkpoint, the same after every restart), with two partitions:

- partition 0, *commits*: one record per micro-batch the sink committed (the driver
  appends it in ``commit`` after every task of the batch succeeded, before Spark writes
  its own commit log): the batch id, the run, how many messages were written and how
  many a replay found already written, and the end of the intents partition then (every
  intent of a later batch is after it). Its last record is all a task reads of it.
- partition 1, *intents*: one record per produce of a task, appended (and acknowledged)
  **before** the produce: for each piece of the task's output it is about to write, the
  target partition, the piece's number within the task's output for that partition,
  the sequence number it will be placed at (ProduceWithSeqnum), the message count and a
  digest of the keys and values. A retried or replayed attempt of the task reads the
  intents of the earlier attempts and checks, in the target partition, whether each
  piece is there (:mod:`gateway.spark.exactly_once`).

Records are JSON (a ``v`` field versions them). The topic is created on first use with
4 MiB segments and ``retention.segments.count=4``: a task reads only the last commit
and the intents of the batch in hand, so older records may go; each partition keeps at
most five segments (40 MiB per query).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.client.errors import (
    BoundaryError,
    RequestFailed,
    TopicExistsError,
    UnknownTopicError,
)
from gateway.client.tank_blocking import BlockingTankClient

COMMITS: Final = 0
INTENTS: Final = 1
VERSION: Final = 1
#: CreateTopic config of a commit topic (see the module docstring).
TOPIC_CONFIG: Final = {"log.segment.bytes": str(4 * 1024 * 1024),
                       "retention.segments.count": "4"}
_FETCH: Final = 256 * 1024


class LedgerError(RuntimeError):
    """The commit topic holds something this version can not read, or can not be used."""


def topic_name(prefix: str, query_id: str) -> str:
    """The commit topic of the query ``query_id``."""
    return f"{prefix}-{query_id}"


@dataclass(frozen=True, slots=True)
class Commit:
    """A micro-batch the sink committed."""

    batch: int
    run: str
    #: The high-water mark of the intents partition when the batch was committed.
    intents_end: int
    written: int = 0
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class Piece:
    """Part of a task's output for one target partition, written as one bundle."""

    partition: int
    #: Its number among the task's pieces for ``partition`` (0, 1, ...).
    index: int
    #: The sequence number its first message is placed at.
    first: int
    count: int
    digest: str


@dataclass(frozen=True, slots=True)
class Intent:
    """What one attempt of one task was about to write (before it wrote it)."""

    batch: int
    task: int
    #: Unique per attempt (Spark's task attempt id and a random part).
    attempt: str
    #: The target's partition count the attempt placed keyed rows with.
    partitions: int
    pieces: tuple[Piece, ...]
    #: With the attempt's last produce: its number of pieces per target partition.
    totals: Mapping[int, int] | None = None


def encode_commit(commit: Commit) -> bytes:
    return json.dumps({"v": VERSION, "batch": commit.batch, "run": commit.run,
                       "intents_end": commit.intents_end, "written": commit.written,
                       "skipped": commit.skipped}, separators=(",", ":")).encode()


def decode_commit(data: bytes) -> Commit:
    record = _record(data)
    try:
        return Commit(int(record["batch"]), str(record["run"]), int(record["intents_end"]),
                      int(record.get("written", 0)), int(record.get("skipped", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerError(f"a commit record without {exc}: {data[:200]!r}") from None


def encode_intent(intent: Intent) -> bytes:
    record: dict[str, Any] = {
        "v": VERSION, "batch": intent.batch, "task": intent.task, "attempt": intent.attempt,
        "partitions": intent.partitions,
        "pieces": [[p.partition, p.index, p.first, p.count, p.digest] for p in intent.pieces]}
    if intent.totals is not None:
        record["totals"] = {str(p): n for p, n in sorted(intent.totals.items())}
    return json.dumps(record, separators=(",", ":")).encode()


def decode_intent(data: bytes) -> Intent:
    record = _record(data)
    try:
        totals = record.get("totals")
        return Intent(
            int(record["batch"]), int(record["task"]), str(record["attempt"]),
            int(record["partitions"]),
            tuple(Piece(int(p), int(i), int(s), int(n), str(d))
                  for p, i, s, n, d in record["pieces"]),
            None if totals is None else {int(p): int(n) for p, n in totals.items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerError(f"an intent record without {exc}: {data[:200]!r}") from None


def _record(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except ValueError:
        raise LedgerError(f"not a commit topic record: {data[:200]!r}") from None
    if not isinstance(record, dict) or record.get("v") != VERSION:
        raise LedgerError(f"a commit topic record of another version: {data[:200]!r}")
    return record


class Ledger:
    """The commit topic ``topic`` over a connected client."""

    def __init__(self, client: BlockingTankClient, topic: str) -> None:
        self.client = client
        self.topic = topic

    def ensure(self) -> None:
        """Create the topic unless it exists (tasks of one batch may race to: fine)."""
        try:
            bounds = self.client.discover_partitions(self.topic)
        except UnknownTopicError:
            try:
                self.client.create_topic(self.topic, 2, TOPIC_CONFIG)
            except TopicExistsError:
                pass  # another task was first
            except RequestFailed as exc:
                raise LedgerError(f"could not create the commit topic {self.topic!r}: "
                                  f"{exc}") from None
            bounds = self.client.discover_partitions(self.topic)
        if len(bounds) < 2:
            raise LedgerError(f"the commit topic {self.topic!r} has {len(bounds)} partition(s), "
                              "not 2 (was it created by something else?)")

    def ends(self) -> tuple[int, int]:
        """The high-water marks of the commits and the intents partitions."""
        bounds = {b.partition: b.high_water_mark
                  for b in self.client.discover_partitions(self.topic, [COMMITS, INTENTS])}
        return bounds[COMMITS], bounds[INTENTS]

    def last_commit(self) -> Commit | None:
        """The newest commit record, or None when no batch was committed yet."""
        end, _ = self.ends()
        if end == 0:
            return None
        try:
            result = self.client.consume(self.topic, COMMITS, end, fetch_size=_FETCH)
        except BoundaryError:
            return None  # removed since the look at the bounds: nothing to go by
        last = [m for m in result.messages if m.seq == end]
        return decode_commit(last[0].value) if last else None

    def intents(self, start: int) -> tuple[list[Intent], int]:
        """The intent records from sequence ``start`` (or the first one kept, when
        retention removed it) to the end, and where the next read starts."""
        found = []
        for seq, value in self._read(INTENTS, start):
            found.append(decode_intent(value))
            start = seq + 1
        return found, start

    def _read(self, partition: int, seq: int) -> Iterator[tuple[int, bytes]]:
        while True:
            try:
                result = self.client.consume(self.topic, partition, max(seq, 1),
                                             fetch_size=_FETCH)
            except BoundaryError as exc:
                if exc.first_available > seq:
                    seq = exc.first_available
                    continue
                return  # past the end
            if not result.messages and result.next_seq <= seq:
                return  # at the end
            for message in result.messages:
                if message.seq >= seq:
                    yield message.seq, message.value
            seq = max(seq + 1, result.next_seq)
            if seq > result.high_water_mark:
                return  # read to the end: no need to ask again

    def append_intent(self, intent: Intent) -> None:
        self.client.produce({(self.topic, INTENTS): [encode_intent(intent)]})

    def append_commit(self, commit: Commit) -> None:
        self.client.produce({(self.topic, COMMITS): [encode_commit(commit)]})
