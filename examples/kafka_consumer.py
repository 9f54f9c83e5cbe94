"""Read a partition with a Kafka client (confluent-kafka), from an offset on.

    python examples/kafka_consumer.py --topic orders --from 0 --count 20

Each line names the Kafka offset and the Tank sequence / Figg offset of the same message
(offset + 1), so a position can be handed to the other client families: a Kafka consumer
that processed offset N continues as a Tank consumer at sequence N + 2, or as a Figg
subscriber attached with offset N + 1. ``--from earliest`` / ``latest`` as Kafka's
``auto.offset.reset``. It stops after ``--count`` messages, or when none arrive for
``--idle`` seconds. A broker that is not there ends it with one line on stderr and exit
status 1.
"""

from __future__ import annotations

import argparse
import time

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from run_example import Failed, run_example

from gateway.core.config import parse_address


def start_offset(text: str) -> int:
    """``earliest``, ``latest`` or an offset (0 or more)."""
    named = {"earliest": OFFSET_BEGINNING, "latest": OFFSET_END}
    if text in named:
        return named[text]
    offset = int(text)
    if offset < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {offset}")
    return offset


def main() -> None:
    """Print ``--count`` messages from ``--from`` on."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kafka", type=parse_address, default="127.0.0.1:9092",
                        help="Kafka listener HOST:PORT")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--from", dest="start", type=start_offset, default=OFFSET_BEGINNING,
                        help="Kafka offset to start at, or earliest / latest")
    parser.add_argument("--count", type=int, default=10, help="messages to read (0: no end)")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="stop after this many seconds without a message")
    args = parser.parse_args()

    host, port = args.kafka
    down: list[KafkaError] = []  # librdkafka retries a broker that is not there; we stop
    consumer = Consumer({"bootstrap.servers": f"{host}:{port}", "group.id": "examples",
                         "enable.auto.commit": False, "socket.timeout.ms": 5000,
                         "topic.metadata.refresh.interval.ms": 1000, "log_level": 0,
                         "error_cb": lambda error: down.append(error)})
    received, last_seen = 0, time.monotonic()
    try:
        consumer.assign([TopicPartition(args.topic, args.partition, args.start)])
        while (args.count == 0 or received < args.count) and \
                time.monotonic() - last_seen < args.idle:
            message = consumer.poll(0.2)
            if any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in down):
                raise Failed(f"could not reach the Kafka listener at {host}:{port}: "
                             f"{down[0].str()}")
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise Failed(f"reading {args.topic}/{args.partition} from {host}:{port} "
                             f"failed: {error.str()}")
            received, last_seen = received + 1, time.monotonic()
            key = (message.key() or b"").decode(errors="replace")
            value = (message.value() or b"").decode(errors="replace")
            print(f"offset={message.offset()} seq={message.offset() + 1} key={key} "
                  f"value={value}")
    finally:
        consumer.close()


if __name__ == "__main__":
    run_example(main)
