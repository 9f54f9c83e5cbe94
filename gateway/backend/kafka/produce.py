"""The gateway's idempotent producer to the upstream, in figtank's own Kafka client.

:meth:`UpstreamProducer.send` queues one bundle for its partition and returns. A sender
task turns what each partition has queued into ONE Kafka record batch (every message of
every queued bundle, up to ``max_batch_bytes`` of records uncompressed, in one compiled call:
:func:`~protocols.kafka.upstream_codec.bundles_to_record_batch`) and sends the batches of
all partitions a broker leads in one Produce request (``acks=all``). Each bundle's
outcome comes when the upstream answered its batch: OK with the sequence numbers (offset
+ 1) of its first and last message, else the error, mapped to the Tank code the front
ends know (:func:`refused_outcome`) and counted in ``figtank_upstream_errors``.

A Kafka client's own idempotent batch (one that reached the gateway's Kafka listener with
a producer id the upstream issued) goes up alone under the client's stamp, not merged:
the upstream then checks its sequence itself, so a retry that reaches the cluster through
another gateway is stored once.

Idempotence, Kafka's rules (KIP-98): the producer id comes from the upstream
(InitProducerId), so it is unique across every gateway of the cluster; each partition's
batches carry consecutive sequence numbers. A partition has up to ``max_in_flight`` (5,
Kafka's bound for idempotence) batches on their way, on one connection per broker, whose
requests leave in the order they were made (:meth:`BrokerConnection.submit`). When one
fails, the batches after it are collateral (the upstream refuses a gap in the
sequence): once every answer is in, a retriable failure sends them all again as they
were (same sequences: the upstream stores each once) until the delivery timeout, and any
other failure fails that batch alone and numbers the rest again after it.

Errors that mean the upstream lost or refuses the producer's state (UNKNOWN_PRODUCER_ID
after a restart of a broker without durable producer state, OUT_OF_ORDER_SEQUENCE_NUMBER
on a partition's first batch on its way, INVALID_PRODUCER_EPOCH) and batches given up at
the delivery timeout (their fate unknown) make the producer get a new producer id; the
batches on their way are then numbered again under it, from sequence 0. Such a batch may
have been stored already, unacknowledged: it can be stored twice, never lost.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

import structlog
import trio

from gateway.backend.kafka.cluster import PRODUCE, STALE_METADATA, Cluster
from gateway.backend.kafka.wire import BrokerLost, error_name
from gateway.core.contract import ProduceCode, ProduceOutcome
from gateway.core.metrics import Metrics
from gateway.store.producers import ProducerBatch
from protocols.errors import ProtocolError
from protocols.kafka.codecs import Compression
from protocols.kafka.produce_frames import PartitionAnswer
from protocols.kafka.records import (
    InitProducerIdRequest,
)
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.kafka.upstream_codec import bundles_to_record_batch
from protocols.tank.bundle import plain_size

log = structlog.get_logger("figtank.upstream_kafka")
#: What :meth:`UpstreamProducer._dispatch` answers when no partition waits to retry.
_NO_RETRY: Final = 3600.0
#: While a batch of a partition is on its way, fewer bytes than this queued behind it
#: wait for its answer (and grow); more go at once, up to ``max_in_flight`` batches. Low
#: enough that a publisher's window (figg-bench: 256 messages, ~40 KB) is split between
#: two or three batches on their way, so the gateway, the cluster and the client work at
#: once rather than in turn (figg publish +25% over holding 128 KiB), high enough that a
#: trickle of small publishes still shares requests.
_HOLD_BELOW: Final = 16 * 1024

#: Called in the trio thread with a bundle's outcome.
Done = Callable[[ProduceOutcome], None]

_SEQUENCE_MOD: Final = 1 << 31
#: Errors after which the same batch goes again (after asking the metadata anew).
_RETRIABLE: Final = STALE_METADATA | {
    ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
}
#: Errors meaning the upstream lost (or fences) the producer's state: a new producer id.
_PRODUCER_STATE: Final = frozenset({
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID,
    ErrorCode.INVALID_PRODUCER_EPOCH, 49,  # INVALID_PRODUCER_ID_MAPPING
})
#: An unknown topic or partition is retried this many times (a topic just created may not
#: be known to every broker yet), then refused.
_UNKNOWN_TOPIC_TRIES: Final = 3

#: Kafka error names -> the Tank code a front end shows (others: I/O fault).
_CODES: Final = {
    "UNKNOWN_TOPIC_OR_PARTITION": ProduceCode.UNKNOWN_TOPIC,
    "TOPIC_AUTHORIZATION_FAILED": ProduceCode.READ_ONLY,
    "CLUSTER_AUTHORIZATION_FAILED": ProduceCode.READ_ONLY,
    "TIMED_OUT": ProduceCode.IO_FAULT,
}
#: Errors a Kafka client in front gets as the upstream's own (others: the Kafka listener's
#: answer for the Tank code).
_KAFKA_ERRORS: Final = {
    # Not retriable: a client told KAFKA_STORAGE_ERROR retries until its timeout.
    "MESSAGE_TOO_LARGE": ErrorCode.MESSAGE_TOO_LARGE,
    "RECORD_LIST_TOO_LARGE": ErrorCode.MESSAGE_TOO_LARGE,
    "INVALID_RECORD": ErrorCode.INVALID_RECORD,
    # A Kafka client's own idempotent batch (passed through with its stamp) the upstream
    # refused: the client's producer handles these itself.
    "OUT_OF_ORDER_SEQUENCE_NUMBER": ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    "UNKNOWN_PRODUCER_ID": ErrorCode.UNKNOWN_PRODUCER_ID,
    "INVALID_PRODUCER_EPOCH": ErrorCode.INVALID_PRODUCER_EPOCH,
}


def produce_code(error: str) -> ProduceCode:
    """The Tank produce code for an upstream error (by Kafka's name)."""
    return _CODES.get(error, ProduceCode.IO_FAULT)


def refused_outcome(error: str, text: str) -> ProduceOutcome:
    """The outcome of a bundle the upstream refused with ``error`` (Kafka's name)."""
    return ProduceOutcome(produce_code(error), reason=_reason(error, text),
                          kafka_error=_KAFKA_ERRORS.get(error, 0))


def _reason(name: str, text: str) -> str:
    if name in ("MESSAGE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"):
        return f"message too large for the upstream: {text}"
    if name in ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"):
        return f"upstream authorization failed: {text}"
    if name == "TIMED_OUT":
        return f"the upstream did not acknowledge in time: {text}"
    return f"upstream: {text}"


class _Item:
    __slots__ = ("bundle", "count", "done", "queued", "size", "stamp")

    def __init__(self, bundle: bytes, count: int, done: Done, queued: float,
                 stamp: ProducerBatch | None) -> None:
        self.bundle = bundle
        self.count = count
        #: Its records' bytes once uncompressed: what a batch is sized by.
        self.size = plain_size(bundle)
        self.done = done
        self.queued = queued
        self.stamp = stamp


class _Batch:
    """One record batch of a partition, on its way (or to be sent again)."""

    __slots__ = ("base_seq", "count", "data", "error", "items", "pid", "sent")

    def __init__(self, items: list[_Item], data: bytes, pid: tuple[int, int], base_seq: int,
                 count: int) -> None:
        self.items = items
        self.data = data
        self.pid = pid
        self.base_seq = base_seq
        self.count = count
        #: Whether a request carrying it waits for its answer.
        self.sent = False
        #: The upstream's refusal of it (code, name, text), None while there is none.
        self.error: tuple[int, str, str] | None = None


class _Partition:
    """One partition's queue, its batches on their way, and its sequence numbers."""

    __slots__ = ("attempts", "flight", "leader_asked", "next_seq", "partition", "queue",
                 "queued_bytes", "retry_at", "seq_pid", "solo", "stamped", "topic",
                 "unknown_tries")

    def __init__(self, topic: str, partition: int, *, stamped: bool = False) -> None:
        self.topic = topic
        self.partition = partition
        #: A Kafka client's own idempotent batches (one producer id), sent with their
        #: stamps, one bundle per batch, instead of the gateway's.
        self.stamped = stamped
        self.queue: deque[_Item] = deque()
        #: Bytes of records (uncompressed) in ``queue``.
        self.queued_bytes = 0
        #: Batches sent and not answered, or to be sent (again), in sequence order.
        self.flight: deque[_Batch] = deque()
        #: The next sequence number, counted for producer id ``seq_pid``.
        self.next_seq = 0
        self.seq_pid: tuple[int, int] = (-1, -1)
        self.retry_at = 0.0
        self.attempts = 0
        self.unknown_tries = 0
        #: Its leader was asked for (metadata) since it was last sent to.
        self.leader_asked = False
        #: Bundles to send one per batch (a merged batch was too large for the upstream).
        self.solo = 0

    @property
    def answering(self) -> bool:
        """Whether a batch of it waits for its answer."""
        # A loop, not any(generator): asked several times a request (SIM110 would undo it).
        for batch in self.flight:  # noqa: SIM110
            if batch.sent:
                return True
        return False

    @property
    def troubled(self) -> bool:
        """Whether a batch of it was refused (the rest wait until every answer is in)."""
        for batch in self.flight:  # noqa: SIM110 (as answering)
            if batch.error is not None:
                return True
        return False


class UpstreamProducer:
    """The gateway's one producer to the upstream; see the module doc."""

    def __init__(self, cluster: Cluster, *, metrics: Metrics | None = None,
                 delivery_timeout: float = 10.0, request_timeout: float = 5.0,
                 max_batch_bytes: int = 512 * 1024, max_in_flight: int = 5,
                 compression: Compression | None = None,
                 on_trouble: Callable[[], None] | None = None,
                 on_stored: Callable[[str, int, int, bytes], None] | None = None) -> None:
        self._cluster = cluster
        self._metrics = metrics
        self.delivery_timeout = delivery_timeout
        self.request_timeout = request_timeout
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight = max_in_flight
        #: The codec of every batch; None: the producer's choice (Snappy when a batch holds
        #: a Snappy bundle, else none), as Kafka's ``compression.type=producer``.
        self.compression = compression
        self._on_trouble = on_trouble or (lambda: None)
        self._on_stored = on_stored
        #: By ``(topic, partition)``, and ``(topic, partition, producer id)`` for a Kafka
        #: client's stamped batches.
        self._partitions: dict[tuple[str | int, ...], _Partition] = {}
        self._ready: dict[_Partition, None] = {}
        self._wake = trio.Event()
        self._idle = trio.Event()
        self._pid: tuple[int, int] | None = None
        self._renew = False
        #: Why no producer id can be had (None while the producer has one).
        self.failure: str | None = None
        self._queued_messages = 0
        self._nursery: trio.Nursery | None = None
        self._connecting: set[int] = set()
        #: Topics whose leaders a Metadata request is asking for now.
        self._refreshing: set[str] = set()
        #: Producer ids obtained (1 at the start; more after the upstream lost them).
        self.producer_ids = 0

    # ----------------------------------------------------------------- front side

    def send(self, topic: str, partition: int, bundle: bytes, count: int, done: Done, *,
             stamp: ProducerBatch | None = None, kick: bool = True) -> None:
        """Queue ``bundle`` (``count`` messages) for ``topic``/``partition``; ``done`` gets
        the outcome in the trio thread. ``stamp``: a Kafka client's idempotent batch,
        sent upstream under the client's producer id and sequence (the upstream issued
        that id: :meth:`producer_id`), so that a retry reaching the cluster through any
        gateway is stored once. ``kick=False``: the caller queues more and calls
        :meth:`kick` once after them (they may then share requests)."""
        key = (topic, partition) if stamp is None else (topic, partition, stamp.producer_id)
        state = self._partitions.get(key)
        if state is None:
            state = self._partitions[key] = _Partition(topic, partition,
                                                       stamped=stamp is not None)
        item = _Item(bundle, count, done, trio.current_time(), stamp)
        state.queue.append(item)
        state.queued_bytes += item.size
        self._queued_messages += count
        self._ready[state] = None
        if kick:
            self.kick()

    def kick(self) -> None:
        """Send what can go now, from the calling task: after :meth:`send` (one call
        after a front end's batches, so they share requests) and when an answer comes.
        No wake-up of the sender task per request; what needs waiting (a producer id, a
        leader, a connection, a retry's pause) is left to it."""
        if self._nursery is None or self._pid is None or self._renew or self.failure:
            self._wake.set()
            return
        now = trio.current_time()
        while True:
            later, sent = self._dispatch(now)
            if not sent:
                break
        if later < _NO_RETRY or any(not state.flight or state.troubled
                                    for state in self._ready):
            # A partition waits for a retry, a leader or a connection, or was refused:
            # the sender task keeps the time.
            self._wake.set()

    def in_flight(self) -> int:
        """Messages queued or on their way upstream."""
        return self._queued_messages

    def unavailable(self) -> str | None:
        """Why no publish can succeed now (no producer id to be had), or None."""
        return self.failure

    async def flush(self, deadline: float) -> int:
        """Wait until every queued message has its outcome or ``deadline`` (trio time)
        passes; returns the messages still without one."""
        with trio.move_on_at(deadline):
            while self._queued_messages:
                self._idle = trio.Event()
                await self._idle.wait()
        return self._queued_messages

    # ----------------------------------------------------------------- sender

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Send what is queued until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                now = trio.current_time()
                wait = self._expire(now)
                if (self._ready or self.failure) and (self._pid is None or self._renew):
                    await self._new_producer_id()
                    continue
                later, sent = self._dispatch(now)
                if sent:
                    # More may go before any answer (a long queue, several batches on
                    # their way): the requests already left, dispatch again at once.
                    continue
                self._wake = trio.Event()
                with trio.move_on_after(max(min(wait, later), 0.0)):
                    await self._wake.wait()

    def _dispatch(self, now: float) -> tuple[float, bool]:
        """Send what every partition can send now: one batch each per request, a request
        per broker; returns how long until a partition waiting to retry can, and whether
        anything was sent. Called again at once after a send, and (woken) as answers
        come, so a partition keeps up to ``max_in_flight`` batches on their way."""
        by_node: dict[int, list[tuple[_Partition, _Batch]]] = {}
        later = _NO_RETRY
        unknown: list[str] = []
        for state in list(self._ready):
            if state.troubled:
                if not state.answering:
                    self._settle(state, now)
                if state.troubled:
                    continue
            if not state.flight and not state.queue:
                del self._ready[state]
                continue
            if state.retry_at > now:
                later = min(later, state.retry_at - now)
                continue
            batch = self._next_batch(state)
            if batch is None:
                continue
            node = self._cluster.leaders.get((state.topic, state.partition))
            if node is None or node < 0:
                if state.topic in self._refreshing:
                    continue  # the answer wakes this loop
                if state.leader_asked:  # asked and still none: an election, wait a bit
                    state.retry_at = now + 0.05
                    later = min(later, 0.05)
                state.leader_asked = True
                unknown.append(state.topic)
                continue
            state.leader_asked = False
            by_node.setdefault(node, []).append((state, batch))
        assert self._nursery is not None
        if unknown:
            topics = list(dict.fromkeys(unknown))
            self._refreshing.update(topics)
            self._nursery.start_soon(self._refresh, topics)
        sent = False
        for node, parts in by_node.items():
            sent |= self._submit(node, parts)
        return later, sent

    def _next_batch(self, state: _Partition) -> _Batch | None:
        """The batch of ``state`` to send next: the first one not on its way (built again
        when the producer id changed), else a new one from the queue while fewer than
        ``max_in_flight`` are on their way; None when it must wait."""
        assert self._pid is not None
        for batch in state.flight:
            if not batch.sent:
                if batch.pid != self._pid and not state.stamped:
                    if batch is not state.flight[0] or state.answering:
                        return None  # renumbered once the earlier ones are answered
                    # Their items are queued again: the first batch is built from them below.
                    self._renumber(state)
                    break
                return batch
        if not state.queue or len(state.flight) >= (1 if state.stamped else
                                                    self.max_in_flight):
            return None
        if state.flight and state.queued_bytes < _HOLD_BELOW:
            # Another batch is on its way: a small one waits for its answer and takes
            # what queues meanwhile (fewer, larger requests under load; an idle
            # partition's publish still leaves at once).
            return None
        while state.queue:
            built = self._build(state, self._take_items(state))
            if built is not None:
                state.flight.append(built)
                return built
        return None

    def _take_items(self, state: _Partition) -> list[_Item]:
        items = [state.queue.popleft()]
        size = items[0].size
        if not state.stamped:
            limit = 1 if state.solo else 1 << 30
            while state.queue and len(items) < limit and \
                    size + state.queue[0].size <= self.max_batch_bytes:
                item = state.queue.popleft()
                items.append(item)
                size += item.size
            if state.solo:
                state.solo -= 1
        state.queued_bytes -= size
        return items

    def _build(self, state: _Partition, items: list[_Item]) -> _Batch | None:
        """Stamp ``items`` as the partition's next batch. A bundle that does not convert
        (malformed: the front ends check only its header) is refused alone, and the batch
        made of the others; None when none is left."""
        try:
            return self._convert(state, items)
        except (ProtocolError, ValueError):
            items = self._refuse_unconvertible(items)
            return self._convert(state, items) if items else None

    def _refuse_unconvertible(self, items: list[_Item]) -> list[_Item]:
        """Refuse the items whose bundle does not convert; the others."""
        good = []
        for item in items:
            try:
                bundles_to_record_batch([item.bundle], producer_id=0, producer_epoch=0,
                                        base_sequence=0, now_ms=0)
            except (ProtocolError, ValueError) as exc:
                self._count("INVALID_BUNDLE")
                self._deliver(item, ProduceOutcome(ProduceCode.IO_FAULT,
                                                   reason=f"invalid bundle: {exc}"))
            else:
                good.append(item)
        return good

    def _convert(self, state: _Partition, items: list[_Item]) -> _Batch:
        now_ms = int(time.time() * 1000)
        if state.stamped:
            stamp = items[0].stamp
            assert stamp is not None
            pid = (stamp.producer_id, stamp.epoch)
            data, count = bundles_to_record_batch(
                [items[0].bundle], producer_id=pid[0], producer_epoch=pid[1],
                base_sequence=stamp.first_seq, now_ms=now_ms,
                compression=self._codec(items))
            return _Batch(items, data, pid, stamp.first_seq, count)
        assert self._pid is not None
        if state.seq_pid != self._pid:
            state.seq_pid = self._pid
            state.next_seq = 0
        base_seq = state.next_seq
        data, count = bundles_to_record_batch(
            [i.bundle for i in items], producer_id=self._pid[0], producer_epoch=self._pid[1],
            base_sequence=base_seq, now_ms=now_ms, compression=self._codec(items))
        state.next_seq = (base_seq + count) % _SEQUENCE_MOD
        return _Batch(items, data, self._pid, base_seq, count)

    def _codec(self, items: list[_Item]) -> Compression:
        if self.compression is not None:
            return self.compression
        # A bundle's flags byte holds its codec in the low two bits (Snappy: 1).
        if any(i.bundle[0] & 3 for i in items):
            return Compression.SNAPPY
        return Compression.NONE

    def _renumber(self, state: _Partition) -> None:
        """Build every batch of ``state`` on its way again, from its first one's items:
        after a batch before them was refused, or under a new producer id."""
        if state.flight and state.flight[0].pid == state.seq_pid:
            state.next_seq = state.flight[0].base_seq
        items = [i for b in state.flight for i in b.items]
        state.flight.clear()
        state.queue.extendleft(reversed(items))
        state.queued_bytes += sum(i.size for i in items)

    def _submit(self, node: int, parts: list[tuple[_Partition, _Batch]]) -> bool:
        """Send one Produce with ``parts`` to ``node`` now (in order with the requests
        before it), and wait for its answer in a task of its own; False when it could not
        go (no connection yet: one is being opened)."""
        connection = self._cluster.open_connection(node, PRODUCE)
        assert self._nursery is not None
        if connection is None:
            if node not in self._connecting:
                self._connecting.add(node)
                self._nursery.start_soon(self._connect, node)
            return False
        topics: dict[str, list[tuple[int, bytes | None]]] = {}
        for state, batch in parts:
            topics.setdefault(state.topic, []).append((state.partition, batch.data))
        try:
            connection.submit_produce(
                -1, int(self.request_timeout * 1000),
                [(t.encode(), p) for t, p in topics.items()],
                timeout=self.request_timeout + 1,
                on_answer=lambda answer, error: self._answered(parts, answer, error))
        except BrokerLost as exc:
            for state, batch in parts:
                self._refused(state, batch, -1, "NETWORK_EXCEPTION", str(exc))
            return False
        for _, batch in parts:
            batch.sent = True
        return True

    async def _connect(self, node: int) -> None:
        try:
            await self._cluster.node(node, PRODUCE)
        except BrokerLost as exc:
            self._on_trouble()
            for state in self._ready:
                node_of = self._cluster.leaders.get((state.topic, state.partition))
                if node_of == node:
                    self._cluster.forget(state.topic, state.partition)
            log.debug("upstream_connect_failed", node=node, error=str(exc))
            await trio.sleep(0.05)
        finally:
            self._connecting.discard(node)
            self._wake.set()

    def _answered(self, parts: list[tuple[_Partition, _Batch]],
                  answer: list[PartitionAnswer] | None, error: BaseException | None) -> None:
        """A Produce's answer (from the connection's reader), or why none will come."""
        if error is not None:
            self._on_trouble()
            for state, batch in parts:
                self._cluster.forget(state.topic, state.partition)
                self._refused(state, batch, -1, "NETWORK_EXCEPTION", str(error))
            self._wake.set()
            return
        assert answer is not None  # no error: the answer came
        found = {(part[0], part[1]): part for part in answer}
        through: list[tuple[_Partition, _Batch, int]] = []
        for state, batch in parts:
            part = found.get((state.topic, state.partition))
            if part is None:
                self._refused(state, batch, -1, "NETWORK_EXCEPTION",
                              "the upstream's answer left the partition out")
                continue
            _, _, code, base_offset, log_append_time_ms, message = part
            if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                batch.sent = False
                self._stored(state, batch, base_offset)
                if self._on_stored is not None and code == ErrorCode.NONE and \
                        base_offset >= 0 and log_append_time_ms == -1:
                    through.append((state, batch, base_offset))
            else:
                name = error_name(code)
                self._refused(state, batch, code, name, message or name)
        # The next batches leave before the stored ones go to the readers (on_stored may
        # write them to every subscriber's socket): the upstream works meanwhile.
        self.kick()
        if through:
            on_stored = self._on_stored
            assert on_stored is not None
            for state, batch, base_offset in through:
                on_stored(state.topic, state.partition, base_offset, batch.data)

    def _refused(self, state: _Partition, batch: _Batch, code: int, name: str,
                 text: str) -> None:
        """Note the refusal; what follows is decided once every answer is in."""
        batch.sent = False
        if batch.error is None:
            batch.error = (code, name, text)
        self._ready[state] = None

    def _stored(self, state: _Partition, batch: _Batch, base_offset: int) -> None:
        if batch in state.flight:
            state.flight.remove(batch)
        state.attempts = 0
        state.unknown_tries = 0
        first = base_offset + 1
        for item in batch.items:
            last = first + item.count - 1
            self._deliver(item, ProduceOutcome(ProduceCode.OK, first, last)
                          if base_offset >= 0 else ProduceOutcome(ProduceCode.OK))
            first = last + 1

    def _settle(self, state: _Partition, now: float) -> None:
        """Every answer of ``state``'s batches is in and one was refused: decide by the
        first refused batch (those after it only failed for the gap it left)."""
        first = next(b for b in state.flight if b.error is not None)
        code, name, text = first.error  # type: ignore[misc]
        for batch in state.flight:
            batch.error = None
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            state.unknown_tries += 1
            if state.unknown_tries >= _UNKNOWN_TOPIC_TRIES:
                self._fail_first(state, first, name, text)
                return
        if code in _RETRIABLE or code == -1:
            self._cluster.forget(state.topic, state.partition)
            self._retry(state, first, now, f"{name}: {text}")
        elif code in _PRODUCER_STATE and not state.stamped:
            if first.pid == self._pid:
                self._renew = True
                log.warning("upstream_producer_state_lost", error=name, topic=state.topic,
                            partition=state.partition, producer_id=first.pid[0])
            self._retry(state, first, now, f"{name}: {text}")
        elif code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE) and \
                len(first.items) > 1 and not state.stamped:
            # A merged batch over the upstream's limit: its bundles go one by one.
            solo = sum(len(b.items) for b in state.flight)
            self._renumber(state)
            state.solo = solo
        else:
            self._fail_first(state, first, name, text)

    def _fail_first(self, state: _Partition, batch: _Batch, name: str, text: str) -> None:
        """The upstream refused ``batch`` for good: its bundles fail, and the batches
        after it are numbered again (it left a gap)."""
        if batch is not state.flight[0]:
            # Earlier batches were not refused but not answered as stored either (their
            # answers were lost): they go again as they are.
            self._retry(state, state.flight[0], trio.current_time(), f"{name}: {text}")
            return
        state.flight.popleft()
        if batch.pid == state.seq_pid and not state.stamped:
            state.next_seq = batch.base_seq
        self._renumber(state)
        state.attempts = 0
        state.unknown_tries = 0
        self._count(name)
        outcome = refused_outcome(name, text)
        for item in batch.items:
            self._deliver(item, outcome)

    def _retry(self, state: _Partition, first: _Batch, now: float, reason: str) -> None:
        """Send ``state``'s batches again as they are after a pause, or give up on them
        past the delivery timeout."""
        if now - first.items[0].queued > self.delivery_timeout:
            # Given up with their fate unknown: the next batch can not follow their
            # sequences, so the producer starts again under a new id.
            self._renew = self._renew or not state.stamped
            batches = list(state.flight)
            state.flight.clear()
            state.attempts = 0
            self._count("TIMED_OUT")
            outcome = refused_outcome("TIMED_OUT", reason)
            for batch in batches:
                for item in batch.items:
                    self._deliver(item, outcome)
            return
        state.attempts += 1
        state.retry_at = now + min(0.025 * (2 ** min(state.attempts, 6)), 1.0)

    def _deliver(self, item: _Item, outcome: ProduceOutcome) -> None:
        self._queued_messages -= item.count
        try:
            item.done(outcome)
        except Exception:  # a front end's bug must not stop the others' acks
            log.exception("upstream_produce_callback_failed")
        if not self._queued_messages:
            self._idle.set()

    def _expire(self, now: float) -> float:
        """Fail bundles queued longer than the delivery timeout while nothing could be
        sent (no producer id, no leader); returns the time until the next may expire."""
        soonest = 3600.0
        for state in list(self._ready):
            queue = state.queue
            while queue and now - queue[0].queued > self.delivery_timeout:
                item = queue.popleft()
                state.queued_bytes -= item.size
                self._count("TIMED_OUT")
                self._deliver(item, refused_outcome(
                    "TIMED_OUT", self.failure or "the upstream did not take it in time"))
            if queue:
                soonest = min(soonest, queue[0].queued + self.delivery_timeout - now)
        return soonest

    async def _refresh(self, topics: list[str]) -> None:
        try:
            await self._cluster.metadata(topics)
        except BrokerLost:
            self._on_trouble()
        finally:
            self._refreshing.difference_update(topics)
            self._wake.set()

    async def producer_id(self) -> tuple[int, int]:
        """A new producer id and epoch from the upstream (InitProducerId, non-transactional);
        :class:`BrokerLost` when it gives none."""
        connection = await self._cluster.any_broker()
        answer = await connection.call(ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest(
            transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1,
            producer_epoch=-1), timeout=self.request_timeout)
        if answer.error_code:
            raise ProducerIdRefused(f"InitProducerId refused: "
                                    f"{error_name(answer.error_code)}")
        return answer.producer_id, answer.producer_epoch

    async def _new_producer_id(self) -> None:
        """Ask the upstream for the gateway's producer id (again), waiting between
        failures."""
        try:
            pid = await self.producer_id()
        except BrokerLost as exc:
            if isinstance(exc, ProducerIdRefused):
                # The cluster answers and refuses: no publish can succeed (while it does
                # not answer, its health says so, and this is not the reason).
                if self.failure is None:
                    log.error("upstream_producer_id_refused", reason=str(exc))
                self.failure = f"the upstream gives no producer id: {exc}"
            else:
                self._on_trouble()
            with trio.move_on_after(0.5):
                await trio.sleep_forever()
            self._expire(trio.current_time())
            return
        renewed = self._pid is not None
        self._pid = pid
        self._renew = False
        self.failure = None
        self.producer_ids += 1
        if renewed:
            log.info("upstream_producer_renewed", producer_id=pid[0], epoch=pid[1])

    def _count(self, error: str) -> None:
        if self._metrics is not None:
            self._metrics.upstream_errors.labels("produce", error).inc()


class ProducerIdRefused(BrokerLost):
    """The cluster answered InitProducerId with an error (e.g. no IdempotentWrite
    permission)."""
