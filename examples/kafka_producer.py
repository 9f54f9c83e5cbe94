"""Produce keyed messages with a Kafka client (confluent-kafka, i.e. librdkafka).

    python examples/kafka_producer.py --topic orders --count 100

figtank's Kafka listener (``listen.kafka``, default 127.0.0.1:9092) takes them into the
same log as Figg and Tank: the message at Kafka offset N is Tank sequence N + 1 and Figg
offset N + 1. With ``acks=all`` each delivery report comes once the gateway has made the
append durable (``store.durability``). A broker that is not there, or a refused produce,
ends it with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import time

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from run_example import Failed, run_example

from gateway.core.config import parse_address


def main() -> None:
    """Produce ``--count`` messages and wait for every delivery report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kafka", type=parse_address, default="127.0.0.1:9092",
                        help="Kafka listener HOST:PORT")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--count", type=int, default=10, help="messages to produce")
    parser.add_argument("--keys", type=int, default=3, help="distinct keys (customer-0, ...)")
    parser.add_argument("--compression", default="none",
                        choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for the broker")
    args = parser.parse_args()

    host, port = args.kafka
    failures: list[KafkaError] = []
    offsets: list[int] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(error)
        else:
            offsets.append(message.offset())

    # log_level 0: librdkafka's own log lines stay off stderr; errors come to error_cb.
    producer = Producer({"bootstrap.servers": f"{host}:{port}", "acks": "all",
                         "compression.type": args.compression, "log_level": 0,
                         "message.timeout.ms": int(args.timeout * 1000),
                         "error_cb": lambda error: failures.append(error)})
    try:
        for i in range(1, args.count + 1):
            producer.produce(args.topic, value=f"order-{i}".encode(),
                             key=f"customer-{i % args.keys}".encode(),
                             partition=args.partition, on_delivery=delivered)
            producer.poll(0)
        deadline = time.monotonic() + args.timeout
        left = producer.flush(0.1)
        while left and not failures and time.monotonic() < deadline:
            left = producer.flush(0.1)  # librdkafka retries a missing broker: stop early
    except KafkaException as exc:
        raise Failed(f"produce to {args.topic} failed: {exc.args[0].str()}") from None
    if failures or left:
        reason = failures[0].str() if failures else f"{left} messages not delivered in time"
        raise Failed(f"produce to {host}:{port} failed: {reason}")
    print(f"produced {args.count} messages to {args.topic}/{args.partition}; "
          f"Kafka offsets {min(offsets)}..{max(offsets)} = "
          f"Tank sequences {min(offsets) + 1}..{max(offsets) + 1}")


if __name__ == "__main__":
    run_example(main)
