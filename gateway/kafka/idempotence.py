"""Idempotent producers: producer ids (InitProducerId) and the sequence checks of Produce.

One :class:`ProducerStates` serves the whole server (every Kafka listener and
connection), so a batch retried on a new connection is recognised. Kafka's rules
(``ProducerStateManager``), per producer id and partition:

- a batch of an older epoch than the last one seen is refused INVALID_PRODUCER_EPOCH;
- a batch equal (epoch, first and last sequence) to one of the last five is a retry: it
  is not appended again, and is answered with the original's base offset (or error),
  once the original has its outcome (it may still be in flight);
- a batch of the same epoch is appended when its base sequence follows the last one
  (wrapping after 2**31 - 1), else refused OUT_OF_ORDER_SEQUENCE_NUMBER; a newer epoch
  must start at sequence 0;
- a producer the partition has no state for (a new one, or one forgotten because
  ``limits.max_producer_states`` was reached) is accepted at whatever sequence, as Kafka
  does since KIP-360.

The state is held in memory here; over the embedded store, each partition also keeps it
durably with its batches (:mod:`gateway.store.producers`: written in the same fsync round
as the batch), and a producer this table does not hold is looked up there
(``recovered``) before it counts as new. So after a restart (a crash included) a retry of
a batch the partition stored is answered with the original's offset instead of being
appended again, and the producer's sequences go on being checked. Over a Tank broker
(bridge mode) or an upstream Kafka cluster the state is in memory only (the upstream
cluster keeps its own for figtank's producer).

The check runs when the request is read (in request order, before the next request of
any connection), so the state moves on as soon as a batch is handed to the backend; a
batch the backend then fails makes the partition forget the producer here (its retry is
then checked against what the backend stored durably, or accepted like a new producer's).
Retries answered as their original are counted in
``figtank_kafka_producer_retries{known_from="memory"|"stored"}``.

Producer ids come from the clock: the first is the time the process started in
microseconds, each next one is one more, so a restarted server does not hand out an id
again (unless the clock went back), with no file in the data directory. InitProducerId
without a transactional id always gets a new id and epoch 0, as on a Kafka broker;
transactional ids are refused (transactions are not served).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from gateway.core.metrics import Metrics
from gateway.store.producers import KEEP_BATCHES, ProducerBudget, ProducerLRU, StoredProducer
from protocols.kafka.records import InitProducerIdResponse
from protocols.kafka.types import ErrorCode

#: Batches remembered per producer and partition (Kafka's ``NUM_BATCHES_TO_RETAIN``).
WINDOW: Final = KEEP_BATCHES
_INT32_MAX: Final = (1 << 31) - 1
#: What a forgotten producer means, as the limit's log line says.
_FORGETS: Final = ("the least recently used producer's sequence state on a partition is "
                   "forgotten (its next batch is accepted at any sequence)")

Key = tuple[str, int, int]
#: ``(topic, partition, producer_id)`` -> what the partition keeps durably, or None.
Recovered = Callable[[str, int, int], StoredProducer | None]


def last_sequence(base: int, delta: int) -> int:
    """The sequence of a batch's last record: ``base + delta``, wrapping after 2**31 - 1
    (Kafka's ``DefaultRecordBatch.incrementSequence``)."""
    if base > _INT32_MAX - delta:
        return delta - (_INT32_MAX - base) - 1
    return base + delta


class BatchEntry:
    """One batch of a producer on a partition, remembered to answer its retries: its
    sequences and, once the backend has answered, its base offset or error."""

    __slots__ = ("_waiters", "base_offset", "error", "first_seq", "key", "last_seq",
                 "message", "stored")

    def __init__(self, key: Key, first_seq: int, last_seq: int, *, stored: bool = False
                 ) -> None:
        self.key = key
        #: Taken from the backend's durable state (not seen by this process).
        self.stored = stored
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.base_offset = -1
        self.error = 0
        self.message: str | None = None
        self._waiters: list[Callable[[], None]] | None = []

    @property
    def settled(self) -> bool:
        """Whether the backend has answered."""
        return self._waiters is None

    def settle(self, base_offset: int, error: int, message: str | None) -> None:
        """Record the backend's answer and call whoever waits for it."""
        self.base_offset, self.error, self.message = base_offset, error, message
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            waiter()

    def when_settled(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the backend has answered (now, if it has)."""
        if self._waiters is None:
            callback()
        else:
            self._waiters.append(callback)


class _State:
    """A producer on one partition: its epoch and last batches (newest last)."""

    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: list[BatchEntry] = []  # a list: a deque takes 10 times the memory


class Verdict:
    """What :meth:`ProducerStates.check` decided for a batch: append it (``entry`` set,
    ``duplicate`` false), answer it as its original (``duplicate``), or refuse it
    (``error``)."""

    __slots__ = ("duplicate", "entry", "error", "message")

    def __init__(self, entry: BatchEntry | None = None, *, duplicate: bool = False,
                 error: int = 0, message: str | None = None) -> None:
        self.entry = entry
        self.duplicate = duplicate
        self.error = error
        self.message = message


class ProducerStates:
    """The server's idempotent producers: ids handed out and, per producer id and
    partition, the epoch and last :data:`WINDOW` batches, for at most ``max_states``
    (producer, partition) pairs, the least recently used forgotten first (a
    :class:`~gateway.store.producers.ProducerLRU`, as each partition of the store keeps;
    counted as ``figtank_limit_hits{limit="max_producer_states"}``). ``recovered`` looks up what
    the backend keeps durably of a producer this table does not hold: with it, a state
    dropped here is not forgotten (it comes back from there), and the backend counts
    what it forgets itself."""

    def __init__(self, max_states: int, metrics: Metrics | None = None, *,
                 first_id: int | None = None, recovered: Recovered | None = None) -> None:
        self._metrics = metrics
        self._recovered = recovered
        self._next_id = time.time_ns() // 1000 if first_id is None else first_id
        self._states: ProducerLRU[Key, _State] = ProducerLRU(ProducerBudget(
            max_states, self._count_forgotten, action=_FORGETS))

    def __len__(self) -> int:
        return len(self._states)

    def new_producer_id(self) -> int:
        """A producer id not handed out before (see the module docstring)."""
        producer_id = self._next_id
        self._next_id += 1
        return producer_id

    def check(self, topic: str, partition: int, producer_id: int, epoch: int,
              base_seq: int, last_delta: int) -> Verdict:
        """Decide what to do with a batch of ``producer_id`` (>= 0) for the partition; an
        accepted batch is remembered at once (settle its entry with the outcome, or call
        :meth:`failed`)."""
        if epoch < 0 or base_seq < 0:
            return Verdict(error=ErrorCode.INVALID_RECORD,
                           message=f"a batch of producer id {producer_id} has epoch "
                                   f"{epoch} and base sequence {base_seq}")
        key = (topic, partition, producer_id)
        last_seq = last_sequence(base_seq, last_delta)
        state = self._states.get(key)
        if state is None:
            state = self._restore(key)
        if state is None:
            state = self._add(key, epoch)
        else:
            self._states.touch(key)
            if epoch == state.epoch:
                for entry in state.batches:
                    if entry.first_seq == base_seq and entry.last_seq == last_seq:
                        if self._metrics is not None:
                            self._metrics.kafka_producer_retries.labels(
                                "stored" if entry.stored else "memory").inc()
                        return Verdict(entry, duplicate=True)
                if state.batches:
                    expected = last_sequence(state.batches[-1].last_seq, 1)
                    if base_seq != expected:
                        return Verdict(error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                       message=f"producer {producer_id} epoch {epoch}: "
                                               f"sequence {base_seq}, expected {expected}")
            elif epoch < state.epoch:
                return Verdict(error=ErrorCode.INVALID_PRODUCER_EPOCH,
                               message=f"producer {producer_id}: epoch {epoch} is older "
                                       f"than {state.epoch}")
            elif base_seq != 0:
                return Verdict(error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                               message=f"producer {producer_id}: new epoch {epoch} "
                                       f"starts at sequence {base_seq}, not 0")
            else:
                state.epoch = epoch
                state.batches.clear()
        entry = BatchEntry(key, base_seq, last_seq)
        batches = state.batches
        if len(batches) >= WINDOW:
            del batches[0]
        batches.append(entry)
        return Verdict(entry)

    def failed(self, entry: BatchEntry) -> None:
        """The backend did not append ``entry``'s batch: forget the producer on that
        partition (it may have more batches in flight after this one)."""
        state = self._states.get(entry.key)
        if state is not None and entry in state.batches:
            self._states.pop(entry.key)

    def _restore(self, key: Key) -> _State | None:
        """The state the backend keeps durably for ``key``, taken into the table (its
        batches answered with their stored offsets), or None."""
        stored = self._recovered(*key) if self._recovered is not None else None
        if stored is None or not stored.batches:
            return None
        state = self._add(key, stored.epoch)
        for batch in stored.batches:
            entry = BatchEntry(key, batch.first_seq, batch.last_seq, stored=True)
            entry.settle(batch.first_offset - 1, 0, None)
            state.batches.append(entry)
        return state

    def _add(self, key: Key, epoch: int) -> _State:
        # A state dropped here while the backend keeps it durably is not forgotten: it is
        # restored from there, and the backend counts what it forgets itself.
        return self._states.add(key, _State(epoch), count=self._recovered is None)

    def _count_forgotten(self) -> None:
        if self._metrics is not None:
            self._metrics.limit_hit("max_producer_states")


def init_producer_id(producers: ProducerStates, transactional_id: str | None,
                     producer_id: int, epoch: int, *, issued: int | None = None
                     ) -> InitProducerIdResponse:
    """The answer to InitProducerId: a new producer id with epoch 0 (also when the client
    names its current id and epoch, versions 3+: Kafka gives an idempotent producer a new
    id then too); INVALID_REQUEST when only one of those is given or the transactional id
    is empty (as Kafka); TRANSACTIONAL_ID_AUTHORIZATION_FAILED for a transactional id
    (clients stop with it). ``issued``: the id to give (an upstream cluster's), instead
    of one of ``producers``'."""
    if transactional_id == "":
        return InitProducerIdResponse(error_code=ErrorCode.INVALID_REQUEST, producer_epoch=-1)
    if transactional_id is not None:
        return InitProducerIdResponse(
            error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_epoch=-1)
    if (producer_id < 0) != (epoch < 0):
        return InitProducerIdResponse(error_code=ErrorCode.INVALID_REQUEST, producer_epoch=-1)
    return InitProducerIdResponse(
        producer_id=producers.new_producer_id() if issued is None else issued,
        producer_epoch=0)
