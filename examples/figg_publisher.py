"""Publish N messages over Figg and wait until the gateway has acknowledged them all.

    python examples/figg_publisher.py --count 10 --topic orders

``publish`` returns as soon as the message is sent (it only waits while the client's
window of unacknowledged messages is full); ``wait_all_acked`` then waits for the ACKs.
An ACK means the message is in the log (fsynced with the default ``durability``).
If the connection drops, the client reconnects and resends what was not acknowledged:
delivery is at-least-once, so subscribers should dedupe by offset.

A server that is not there, or one that refuses the topic (an invalid name, a partition
the topic does not have), ends it with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import time

from run_example import FIGG_OPTIONS, run_example, wait_figg_connected

from gateway.client.figg_blocking import BlockingFiggClient
from gateway.core.config import parse_address


def main() -> None:
    """Publish ``--count`` messages and wait for their ACKs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figg", type=parse_address, default="127.0.0.1:8119",
                        help="Figg address HOST:PORT")
    parser.add_argument("--topic", default="orders", help='Figg topic ("name" or "name/P")')
    parser.add_argument("--count", type=int, default=10, help="messages to publish")
    parser.add_argument("--prefix", default="order", help="messages are PREFIX-1, PREFIX-2, ...")
    args = parser.parse_args()

    acked = 0

    def on_ack(_seq: int) -> None:  # runs in the client's thread, once per message
        nonlocal acked
        acked += 1

    started = time.monotonic()
    with BlockingFiggClient(*args.figg, **FIGG_OPTIONS) as client:
        wait_figg_connected(client, args.figg)  # fail fast when nothing listens
        for i in range(1, args.count + 1):
            client.publish(args.topic, f"{args.prefix}-{i}".encode(), on_ack=on_ack)
        client.wait_all_acked()
    print(f"published {args.count} messages to {args.topic!r}, {acked} acknowledged "
          f"in {time.monotonic() - started:.2f} s")


if __name__ == "__main__":
    run_example(main)
