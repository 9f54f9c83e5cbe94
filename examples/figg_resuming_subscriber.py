"""Subscribe over Figg and resume where the previous run stopped.

    python examples/figg_resuming_subscriber.py --topic orders --state orders.offset

The offset of the last message processed is kept in a small state file. The next run
ATTACHes with that offset, and the gateway resumes right after it (ATTACH with offset
X starts at X + 1; offset 0, the first run, means "from the first available").

Delivery is at-least-once: after a reconnect the client resumes from the last offset it
*received*, and the file is written only *after* a message is processed, so a crash in
between brings that message again. Offsets only grow, so a message whose offset is not
above the saved one was processed already and is skipped (dedupe by offset).

It stops after ``--count`` messages, or when none arrive for ``--idle`` seconds.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
from pathlib import Path

from gateway.client.figg_blocking import BlockingFiggClient
from gateway.config import parse_address


def load_offset(state: Path) -> int:
    """The last offset processed, or 0 (0 asks the gateway for the first available)."""
    try:
        return int(state.read_text())
    except FileNotFoundError:
        return 0


def save_offset(state: Path, offset: int) -> None:
    """Write the offset atomically: a crash leaves the old or the new value, never half."""
    temporary = state.with_name(state.name + ".tmp")
    temporary.write_text(f"{offset}\n")
    os.replace(temporary, state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figg", type=parse_address, default="127.0.0.1:8119",
                        help="Figg address HOST:PORT")
    parser.add_argument("--topic", default="orders", help='Figg topic ("name" or "name/P")')
    parser.add_argument("--state", type=Path, default=Path("figg_subscriber.offset"),
                        help="file holding the last offset processed")
    parser.add_argument("--count", type=int, default=10, help="stop after this many messages")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="stop when no message arrives for this many seconds")
    args = parser.parse_args()

    last = load_offset(args.state)
    processed = 0
    with BlockingFiggClient(*args.figg) as client:
        client.wait_connected(timeout=10)
        subscription = client.subscribe(args.topic, from_offset=last)
        print(f"resuming after offset {last}; the gateway starts after "
              f"{subscription.start_offset}", file=sys.stderr)
        while processed < args.count:
            try:
                message = subscription.get(timeout=args.idle)
            except (queue.Empty, EOFError):
                break
            if message.offset <= last:  # a redelivery (e.g. after a reconnect): done already
                print(f"skipping offset {message.offset}", file=sys.stderr)
                continue
            # "Process" the message; then remember that it was.
            print(f"offset={message.offset} data={message.data.decode(errors='replace')}",
                  flush=True)
            save_offset(args.state, message.offset)
            last = message.offset
            processed += 1
    print(f"processed {processed} messages; last offset {last}", file=sys.stderr)


if __name__ == "__main__":
    main()
