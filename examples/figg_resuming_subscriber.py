"""Subscribe over Figg and resume where the previous run stopped.

    python examples/figg_resuming_subscriber.py --topic orders [--state orders.offset]

The offset of the last message processed is kept in a small state file, by default
``$XDG_STATE_HOME/figtank/figg-<topic>.offset`` (``~/.local/state/figtank/...``: one per
topic, out of the working directory; ``--state`` names another). The next run
ATTACHes with that offset, and the gateway resumes right after it (ATTACH with offset
X starts at X + 1; offset 0, the first run, means "from the first available").

Delivery is at-least-once: after a reconnect the client resumes from the last offset it
*received*, and the file is written only *after* a message is processed, so a crash in
between brings that message again. Offsets only grow, so a message whose offset is not
above the saved one was processed already and is skipped (dedupe by offset).

It stops after ``--count`` messages, or when none arrive for ``--idle`` seconds. A
server that is not there, or that refuses the topic, ends it with one line on stderr
and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
from pathlib import Path

from run_example import FIGG_OPTIONS, run_example, wait_figg_connected

from gateway.client.figg_blocking import BlockingFiggClient
from gateway.core.config import parse_address


def default_state(topic: str) -> Path:
    """``$XDG_STATE_HOME/figtank/figg-<topic>.offset`` (``/`` in the topic becomes ``-``)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "figtank" / f"figg-{topic.replace('/', '-')}.offset"


def load_offset(state: Path) -> int:
    """The last offset processed, or 0 (0 asks the gateway for the first available)."""
    try:
        return int(state.read_text())
    except FileNotFoundError:
        return 0


def save_offset(state: Path, offset: int) -> None:
    """Write the offset atomically: a crash leaves the old or the new value, never half."""
    state.parent.mkdir(parents=True, exist_ok=True)
    temporary = state.with_name(state.name + ".tmp")
    temporary.write_text(f"{offset}\n")
    os.replace(temporary, state)


def main() -> None:
    """Resume after the saved offset; process up to ``--count`` messages."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figg", type=parse_address, default="127.0.0.1:8119",
                        help="Figg address HOST:PORT")
    parser.add_argument("--topic", default="orders", help='Figg topic ("name" or "name/P")')
    parser.add_argument("--state", type=Path,
                        help="file holding the last offset processed (default "
                             "$XDG_STATE_HOME/figtank/figg-TOPIC.offset)")
    parser.add_argument("--count", type=int, default=10, help="stop after this many messages")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="stop when no message arrives for this many seconds")
    args = parser.parse_args()
    state = args.state or default_state(args.topic)

    last = load_offset(state)
    processed = 0
    with BlockingFiggClient(*args.figg, **FIGG_OPTIONS) as client:
        wait_figg_connected(client, args.figg)
        subscription = client.subscribe(args.topic, from_offset=last)
        print(f"resuming after offset {last} (from {state}); the gateway starts after "
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
            save_offset(state, message.offset)
            last = message.offset
            processed += 1
    print(f"processed {processed} messages; last offset {last}", file=sys.stderr)


if __name__ == "__main__":
    run_example(main)
