"""Produce keyed, timestamped messages over Tank, in batches.

    python examples/tank_producer.py --topic orders --count 100 --batch 10

Each ``produce`` call appends one bundle per partition and returns once the gateway has
acknowledged it. A message is a value, ``(key, value)``, or a ``Message`` with an explicit
timestamp in milliseconds (messages without one get the current time).
A broker that is not there or refuses the produce ends it with one line on stderr and
exit status 1.
"""

from __future__ import annotations

import argparse
import time

from run_example import run_example

from gateway.client.tank import Message
from gateway.client.tank_blocking import BlockingTankClient
from gateway.core.config import parse_address


def main() -> None:
    """Produce ``--count`` messages, ``--batch`` per call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tank", type=parse_address, default="127.0.0.1:11011",
                        help="Tank address HOST:PORT")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--count", type=int, default=10, help="messages to produce")
    parser.add_argument("--batch", type=int, default=5, help="messages per produce call")
    parser.add_argument("--keys", type=int, default=3, help="distinct keys (customer-0, ...)")
    args = parser.parse_args()

    where = (args.topic, args.partition)
    with BlockingTankClient(*args.tank) as client:
        for start in range(1, args.count + 1, args.batch):
            now_ms = time.time_ns() // 1_000_000
            batch = [Message(value=f"order-{i}".encode(),
                             key=f"customer-{i % args.keys}".encode(),
                             timestamp=now_ms)
                     for i in range(start, min(start + args.batch, args.count + 1))]
            client.produce({where: batch})  # one bundle, acknowledged when appended
        # The high-water mark is the sequence number of the last message in the partition.
        [bounds] = client.discover_partitions(args.topic, [args.partition])
    print(f"produced {args.count} messages to {args.topic}/{args.partition}; "
          f"high-water mark {bounds.high_water_mark}")


if __name__ == "__main__":
    run_example(main)
