"""A Kafka consumer group member in a process of its own, for the tests that stop one
(SIGTERM: it commits and leaves the group) or kill one (SIGKILL).

``python -m tests.kafka.group_member CLIENT ADDRESS TOPIC GROUP MODE SESSION_MS DELAY``
subscribes with ``CLIENT`` (``confluent`` or ``kafka-python``), plain ``subscribe()``:
where it starts is the group's committed offset (or the earliest). ``MODE`` is ``auto``
(auto commit every 200 ms, and on a rebalance or close) or ``explicit`` (a synchronous
commit every :data:`EVERY` messages, and on a rebalance or close). ``DELAY`` seconds
are spent on each message, so that a test can stop or kill it mid-stream (none after a
SIGUSR1: it reads on at full speed).

One line per event on stdout, flushed as it happens: ``assigned P,P,...`` when its
assignment changes, ``m P O`` for each message consumed (printed as soon as the client
returns it, before anything commits it), ``commit P O`` for each offset an explicit commit
got acknowledged, ``closed`` once it left the group.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

#: Messages between two explicit commits.
EVERY = 7


def say(*words: object) -> None:
    print(*words, flush=True)


class Assignment:
    """Prints the assignment when it changes."""

    def __init__(self) -> None:
        self.shown: list[int] | None = None

    def show(self, partitions: list[int]) -> None:
        partitions = sorted(partitions)
        if partitions != self.shown:
            self.shown = partitions
            say("assigned", ",".join(map(str, partitions)))


def run_confluent(address: str, topic: str, group: str, explicit: bool, session_ms: int,
                  pace: list[float], stop: list[int]) -> None:
    import confluent_kafka as ck

    consumer = ck.Consumer({
        "bootstrap.servers": address, "group.id": group,
        "session.timeout.ms": session_ms, "heartbeat.interval.ms": 200,
        "auto.offset.reset": "earliest", "enable.auto.commit": not explicit,
        "auto.commit.interval.ms": 200, "socket.timeout.ms": 5000,
        "topic.metadata.refresh.interval.ms": 1000})

    def commit() -> None:
        try:
            done = consumer.commit(asynchronous=False)
        except ck.KafkaException:  # nothing consumed yet: nothing to commit
            return
        for tp in done or ():
            if tp.offset >= 0 and not tp.error:
                say("commit", tp.partition, tp.offset)

    def on_revoke(_: Any, partitions: list[Any]) -> None:
        commit()

    consumer.subscribe([topic], on_revoke=on_revoke)
    shown = Assignment()
    consumed = 0
    while not stop:
        message = consumer.poll(0.05)
        shown.show([tp.partition for tp in consumer.assignment()])
        if message is None or message.error():
            continue
        say("m", message.partition(), message.offset())
        consumed += 1
        time.sleep(pace[0])
        if explicit and consumed % EVERY == 0:
            commit()
    if explicit:
        commit()
    consumer.close()  # commits (auto mode), then LeaveGroup


def run_kafka_python(address: str, topic: str, group: str, explicit: bool,
                     session_ms: int, pace: list[float], stop: list[int]) -> None:
    import kafka

    # Explicit mode: kafka-python's own commit on a rebalance is the auto commit's (a
    # blocking commit in a rebalance listener is refused), so auto commit stays on, with
    # an interval longer than any test.
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=address, group_id=group, enable_auto_commit=True,
        auto_commit_interval_ms=3_600_000 if explicit else 200,
        session_timeout_ms=session_ms, heartbeat_interval_ms=200,
        auto_offset_reset="earliest", request_timeout_ms=10000, max_poll_records=20)

    done: dict[Any, int] = {}  # the next offset of each partition, once printed

    def commit() -> None:
        # Not consumer.commit(): its position is past the whole batch, printed or not.
        consumer.commit({tp: kafka.OffsetAndMetadata(offset) for tp, offset in done.items()})
        for tp, offset in sorted(done.items()):
            say("commit", tp.partition, offset)
        done.clear()

    consumer.subscribe([topic])
    shown = Assignment()
    consumed = 0
    while not stop:
        batches = consumer.poll(timeout_ms=50)
        shown.show([tp.partition for tp in consumer.assignment()])
        # A whole batch is processed: the client's position is already past it.
        for records in batches.values():
            for record in records:
                say("m", record.partition, record.offset)
                done[kafka.TopicPartition(record.topic, record.partition)] = record.offset + 1
                consumed += 1
                time.sleep(pace[0])
                if explicit and consumed % EVERY == 0:
                    commit()
    consumer.close()  # commits, then LeaveGroup


def main() -> None:
    client, address, topic, group, mode, session_ms, delay = sys.argv[1:8]
    stop: list[int] = []
    pace = [float(delay)]
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGUSR1, lambda *_: pace.__setitem__(0, 0.0))
    run = run_confluent if client == "confluent" else run_kafka_python
    run(address, topic, group, mode == "explicit", int(session_ms), pace, stop)
    say("closed")


if __name__ == "__main__":
    main()
