"""Appends through librdkafka's idempotent producer, acknowledged into trio.

:meth:`UpstreamProducer.send` hands a bundle's messages to the producer (``produce()``
only queues: it never waits for the network) and returns; librdkafka batches, sends,
retries and keeps the order per partition. A dedicated thread serves the producer's
delivery reports (``poll``): each report lands on its bundle's :class:`_Delivery`, and a
bundle whose every message is reported goes back to the trio thread in one
``run_sync_soon`` per poll, however many bundles finished in it. The event loop never
waits on librdkafka.

A bundle's outcome is OK with the sequence numbers (offset + 1) of its first and last
message once the upstream acknowledged all of them (``acks=all``); else the first error,
mapped to the Tank code the front ends know (:func:`produce_code`) and counted in
``figtank_upstream_errors{operation="produce"}``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import structlog
import trio

from gateway.backend.contract import ProduceCode, ProduceOutcome
from gateway.server.metrics import Metrics
from protocols.kafka.types import ErrorCode
from protocols.tank.bundle import Message

log = structlog.get_logger("figtank.upstream_kafka")

#: Called in the trio thread with a bundle's outcome.
Done = Callable[[ProduceOutcome], None]

#: librdkafka error names -> the Tank code a front end shows (others: I/O fault).
_CODES = {
    "UNKNOWN_TOPIC_OR_PART": ProduceCode.UNKNOWN_TOPIC,
    "_UNKNOWN_TOPIC": ProduceCode.UNKNOWN_TOPIC,
    "_UNKNOWN_PARTITION": ProduceCode.UNKNOWN_PARTITION,
    "TOPIC_AUTHORIZATION_FAILED": ProduceCode.READ_ONLY,
    "CLUSTER_AUTHORIZATION_FAILED": ProduceCode.READ_ONLY,
    "_MSG_TIMED_OUT": ProduceCode.IO_FAULT,
}


#: librdkafka error names a Kafka client in front gets as the upstream's own error (Kafka
#: codes); others get the Kafka listener's answer for the Tank code.
_KAFKA_ERRORS = {
    # Not retriable: a client told KAFKA_STORAGE_ERROR retries until its timeout.
    "MSG_SIZE_TOO_LARGE": ErrorCode.MESSAGE_TOO_LARGE,
    "_MSG_SIZE_TOO_LARGE": ErrorCode.MESSAGE_TOO_LARGE,
}


def produce_code(error_name: str) -> ProduceCode:
    """The Tank produce code for a librdkafka error (by its name)."""
    return _CODES.get(error_name, ProduceCode.IO_FAULT)


def refused_outcome(error_name: str, text: str) -> ProduceOutcome:
    """The outcome of a bundle the upstream (or librdkafka) refused with ``error_name``."""
    return ProduceOutcome(produce_code(error_name), reason=_reason(error_name, text),
                          kafka_error=_KAFKA_ERRORS.get(error_name, 0))


def _reason(name: str, text: str) -> str:
    if name in ("MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE"):
        return f"message too large for the upstream: {text}"
    if name in ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"):
        return f"upstream authorization failed: {text}"
    if name == "_MSG_TIMED_OUT":
        return f"the upstream did not acknowledge in time: {text}"
    return f"upstream: {text}"


class _Delivery:
    """One bundle's messages on their way: counted by the poll thread's reports."""

    __slots__ = ("done", "error", "expected", "first", "last", "lock", "reported")

    def __init__(self, expected: int, done: Done) -> None:
        self.expected = expected
        self.reported = 0
        self.first = -1
        self.last = -1
        self.error: tuple[str, str] | None = None
        self.done = done
        self.lock = threading.Lock()


class UpstreamProducer:
    """The gateway's one producer to the upstream; see the module doc.

    ``producer`` is a ``confluent_kafka.Producer``; ``token`` the trio run's token.
    """

    def __init__(self, producer: Any, token: trio.lowlevel.TrioToken, *,
                 metrics: Metrics | None = None, max_message_bytes: int = 1_000_000) -> None:
        self._producer = producer
        self._token = token
        self._metrics = metrics
        #: Larger messages are refused before any message of their bundle is queued.
        self.max_message_bytes = max_message_bytes
        self._finished: deque[_Delivery] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="figtank-upstream-producer",
                                        daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- trio thread

    def send(self, topic: str, partition: int, messages: Sequence[Message],
             done: Done) -> None:
        """Queue ``messages`` for ``topic``/``partition``; ``done`` gets the outcome."""
        too_large = next((m for m in messages if len(m.value) + len(m.key or b"")
                          > self.max_message_bytes), None)
        if too_large is not None:
            self._count("MSG_SIZE_TOO_LARGE")
            done(refused_outcome("MSG_SIZE_TOO_LARGE", f"{len(too_large.value)} bytes, over "
                                 f"the {self.max_message_bytes} of message.max.bytes"))
            return
        delivery = _Delivery(len(messages), done)
        report = self._make_report(delivery)
        produce = self._producer.produce
        queued = 0
        failure: tuple[str, str] | None = None
        for m in messages:
            try:
                # By keyword: the sixth positional slot is on_delivery (callback's alias).
                produce(topic, m.value, m.key, partition, report, timestamp=m.timestamp or 0)
            except BufferError:
                failure = ("_QUEUE_FULL", "the producer's queue to the upstream is full")
                break
            except Exception as exc:  # KafkaException: refused before queueing
                error = exc.args[0] if exc.args else None
                failure = (error.name(), error.str()) if hasattr(error, "name") else (
                    "_FAIL", repr(exc))
                break
            queued += 1
        if failure is not None:
            self._unqueued(delivery, len(messages) - queued, failure)

    def _make_report(self, delivery: _Delivery) -> Callable[[Any, Any], None]:
        finished = self._finished

        def report(error: Any, message: Any) -> None:  # the poll thread
            with delivery.lock:
                delivery.reported += 1
                if error is not None:
                    if delivery.error is None:
                        delivery.error = (error.name(), error.str())
                else:
                    offset = message.offset()
                    if delivery.first < 0:
                        delivery.first = offset
                    delivery.last = offset
                complete = delivery.reported == delivery.expected
            if complete:
                finished.append(delivery)
        return report

    def _unqueued(self, delivery: _Delivery, count: int, failure: tuple[str, str]) -> None:
        with delivery.lock:
            delivery.reported += count
            if delivery.error is None:
                delivery.error = failure
            complete = delivery.reported == delivery.expected
        if complete:
            self._finished.append(delivery)
            self._deliver()

    def _deliver(self) -> None:
        """Hand every finished bundle its outcome (the trio thread)."""
        finished = self._finished
        while finished:
            delivery = finished.popleft()
            if delivery.error is None:
                outcome = ProduceOutcome(ProduceCode.OK, delivery.first + 1, delivery.last + 1)
            else:
                name, text = delivery.error
                self._count(name)
                outcome = refused_outcome(name, text)
            try:
                delivery.done(outcome)
            except Exception:  # a front end's bug must not stop the others' acks
                log.exception("upstream_produce_callback_failed")

    def _count(self, error: str) -> None:
        if self._metrics is not None:
            self._metrics.upstream_errors.labels("produce", error).inc()

    # ----------------------------------------------------------------- poll thread

    def _poll(self) -> None:
        poll = self._producer.poll
        finished = self._finished
        while not self._stop.is_set():
            poll(0.05)
            if finished:
                try:
                    self._token.run_sync_soon(self._deliver)
                except trio.RunFinishedError:
                    return

    def in_flight(self) -> int:
        """Messages queued or on their way upstream."""
        return len(self._producer)

    def close(self, timeout: float) -> int:
        """Stop the poll thread after flushing for up to ``timeout`` seconds (blocking:
        call it in a worker thread); returns the messages still not acknowledged."""
        self._stop.set()
        self._thread.join()
        return int(self._producer.flush(timeout))
