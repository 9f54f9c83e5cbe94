"""Consume a Tank partition from a sequence number and follow it with long polls.

    python examples/tank_consumer.py --topic orders --from 1 --count 20

Tank consumers keep their own position: each Consume names the sequence number to read
from, and the answer says where the next one starts (``next_seq``). With ``max_wait_ms``
the gateway holds a Consume that finds nothing new until a message is appended (or
the time is up): a long poll, so following the tail costs no busy loop.

``--from 0`` starts at the first available message. A Figg offset is the same number as
a Tank sequence: to continue after Figg offset X, pass ``--from X+1``.
It stops after ``--count`` messages, or when none arrive for ``--idle`` seconds. A
broker that is not there ends it with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import trio
from run_example import run_example

from gateway.client.errors import BoundaryError, UnknownTopicError
from gateway.client.tank import open_tank_client
from gateway.core.config import parse_address


def when(timestamp_ms: int) -> str:
    """A message timestamp (ms since the epoch) as ISO 8601 UTC."""
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def follow(args: argparse.Namespace) -> None:
    """Read from ``args.seq`` on, long-polling for new messages."""
    seq, received = args.seq, 0
    async with open_tank_client(*args.tank) as client:
        with trio.move_on_after(args.idle) as idle:
            while args.count == 0 or received < args.count:
                try:
                    result = await client.consume(args.topic, args.partition, seq,
                                                  max_wait_ms=args.wait_ms)
                except BoundaryError as exc:  # gone (retention), or beyond the end
                    seq = (exc.first_available if seq < exc.first_available
                           else exc.high_water_mark + 1)
                    print(f"continuing at sequence {seq}", file=sys.stderr)
                    continue
                except UnknownTopicError:  # nobody produced yet: wait for the topic
                    await trio.sleep(args.wait_ms / 1000)
                    continue
                messages = result.messages
                if args.count:
                    messages = messages[:args.count - received]
                for message in messages:
                    key = message.key.decode() if message.key is not None else "-"
                    print(f"seq={message.seq} key={key} time={when(message.timestamp)} "
                          f"value={message.value.decode(errors='replace')}", flush=True)
                    received += 1
                if result.messages:
                    idle.deadline = trio.current_time() + args.idle  # still flowing
                # Where to go on: next_seq, unless --count cut this answer short.
                cut = len(messages) < len(result.messages)
                seq = messages[-1].seq + 1 if cut else result.next_seq
    print(f"received {received} messages; next sequence {seq}", file=sys.stderr)


def main() -> None:
    """Parse the arguments and follow the partition."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tank", type=parse_address, default="127.0.0.1:11011",
                        help="Tank address HOST:PORT")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--from", dest="seq", type=int, default=0,
                        help="first sequence number (0: the first available)")
    parser.add_argument("--count", type=int, default=10,
                        help="stop after this many messages (0: no limit)")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="stop when no message arrives for this many seconds")
    parser.add_argument("--wait-ms", type=int, default=1000,
                        help="how long one Consume waits for new messages")
    args = parser.parse_args()
    trio.run(follow, args)


if __name__ == "__main__":
    run_example(main)
