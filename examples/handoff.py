"""Hand a position over between Figg and Tank, with no gap and no duplicate.

    python examples/handoff.py --topic handoff --count 10 --split 4

A Figg offset IS the Tank sequence number of the same message (Figg topic "name/P" is
Tank topic "name", partition P). So a position moves between the protocols unchanged:

1. Figg -> Tank: a Figg subscriber reads ``--split`` messages and stops at offset X;
   a Tank consumer continues with sequence X + 1.
2. Tank -> Figg: a Tank consumer reads ``--split`` messages, the last with sequence Y;
   a Figg subscriber ATTACHes with offset Y and the gateway resumes at Y + 1.

Both runs read the ``--count`` messages this program first produces, and it checks that
each was read exactly once (exit status 1 if not). A server that is not there ends it
with one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse

import trio
from run_example import FIGG_OPTIONS, Failed, run_example

from gateway.client.figg import ConnectionState, FiggClient, open_figg_client
from gateway.client.tank import TankClient, open_tank_client
from gateway.core.config import parse_address
from gateway.figg.offsets import tank_to_figg


async def figg_read(figg: FiggClient, topic: str, after: int, until: int) -> list[int]:
    """Offsets a Figg subscriber reads after offset ``after`` up to offset ``until``."""
    offsets: list[int] = []
    # ATTACH with offset X resumes at X + 1 (X = 0: the first available, i.e. seq 1 here).
    subscription = await figg.subscribe(topic, from_offset=after)
    async for message in subscription:
        print(f"figg offset={message.offset} data={message.data.decode()}")
        offsets.append(message.offset)
        if message.offset >= until:
            break
    await subscription.aclose()  # DETACH: whatever else was buffered is dropped
    return offsets


async def tank_read(tank: TankClient, topic: str, partition: int, seq: int, until: int
                    ) -> list[int]:
    """Sequence numbers a Tank consumer reads from ``seq`` up to ``until``."""
    seqs: list[int] = []
    while seq <= until:
        result = await tank.consume(topic, partition, seq, max_wait_ms=1000)
        for message in result.messages:
            if message.seq > until:
                break
            print(f"tank seq={message.seq} value={message.value.decode()}")
            seqs.append(message.seq)
        seq = result.next_seq
    return seqs


def check(direction: str, read: list[int], first: int, last: int) -> bool:
    """Each of first..last read once, in order."""
    ok = read == list(range(first, last + 1))
    print(f"{direction}: {'no gap, no duplicate' if ok else f'MISMATCH: read {read}'}")
    return ok


async def handoff(args: argparse.Namespace) -> bool:
    """Produce the messages, then hand off both ways; True when both check out."""
    topic, partition = args.topic, args.partition
    figg_topic = tank_to_figg(topic, partition)  # "handoff", or "handoff/P" for P > 0
    async with (open_tank_client(*args.tank) as tank,
                open_figg_client(*args.figg, **FIGG_OPTIONS) as figg):
        with trio.move_on_after(10):  # a server that neither accepts nor refuses
            await figg.wait_connected()
        if figg.state is not ConnectionState.CONNECTED:
            host, port = args.figg
            raise Failed(f"no Figg server answered at {host}:{port} within 10 s "
                         f"(is figtank serve running?)")
        await tank.produce({(topic, partition): [
            f"message-{i}".encode() for i in range(1, args.count + 1)]})
        [bounds] = await tank.discover_partitions(topic, [partition])
        last = bounds.high_water_mark  # our messages are first..last
        first = last - args.count + 1

        # 1. Figg reads first..x, then Tank continues at x + 1.
        figg_part = await figg_read(figg, figg_topic, first - 1, first + args.split - 1)
        x = figg_part[-1]
        print(f"figg stopped at offset {x}: tank continues at sequence {x + 1}")
        tank_part = await tank_read(tank, topic, partition, x + 1, last)
        ok = check("figg -> tank", figg_part + tank_part, first, last)

        # 2. Tank reads first..y, then Figg resumes after offset y.
        tank_part = await tank_read(tank, topic, partition, first, first + args.split - 1)
        y = tank_part[-1]
        print(f"tank stopped at sequence {y}: figg attaches with offset {y}")
        figg_part = await figg_read(figg, figg_topic, y, last)
        return check("tank -> figg", tank_part + figg_part, first, last) and ok


async def main_async(args: argparse.Namespace) -> bool:
    """:func:`handoff`, but never hanging: a demo gives up after 30 s."""
    try:
        with trio.fail_after(30):
            return await handoff(args)
    except trio.TooSlowError:
        raise Failed("gave up after 30 s") from None


def main() -> int:
    """Parse the arguments and hand off both ways; 0 when both check out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figg", type=parse_address, default="127.0.0.1:8119",
                        help="Figg address HOST:PORT")
    parser.add_argument("--tank", type=parse_address, default="127.0.0.1:11011",
                        help="Tank address HOST:PORT")
    parser.add_argument("--topic", default="handoff", help="Tank topic")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--count", type=int, default=10, help="messages to produce")
    parser.add_argument("--split", type=int, default=4,
                        help="messages read before handing over (1 .. count-1)")
    args = parser.parse_args()
    if not 1 <= args.split < args.count:
        parser.error("--split must be between 1 and --count - 1")
    return 0 if trio.run(main_async, args) else 1


if __name__ == "__main__":
    run_example(main)
