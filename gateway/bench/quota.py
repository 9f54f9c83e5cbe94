"""How close a quota holds clients to their rate: ``python -m gateway.bench.quota``.

Starts a figtank in this process (embedded store in a temporary directory, Figg and Tank on
loopback ports), fills a topic while no quota applies, then puts one rule in force for
everyone (``bytes_in_per_sec`` and ``bytes_out_per_sec`` = ``--rate``, a second's burst,
as a reload would) and runs, one after the other, for ``--seconds`` each and as fast as
each client can:

- a Figg publisher (a window of ``--window`` publishes), counting the bytes acknowledged;
- a Tank producer (8 Produce requests in flight), counting the bytes acknowledged;
- a Tank consumer reading the filled topic from its start;
- a Figg subscriber reading it from its start.

It prints the rate each achieved beside the quota, over the whole run and without the
burst (a second's worth of the rate, which a client gets at once: longer runs come
closer to the rate), in payload bytes (the quota counts frame and chunk bytes, a fraction
of a percent more with the default 16 KiB messages). ``--json`` prints one JSON object
instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from gateway.auth.quotas import QuotaRules, parse_quotas
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from gateway.core.config import Settings
from gateway.core.logs import configure_logging
from gateway.server.run import ServerInfo, open_server

MIB = 1024 * 1024
HISTORY = "quota-history"


@dataclass
class Result:
    """One client's run: payload bytes moved in ``seconds``."""

    client: str
    direction: str
    quota_bytes_per_sec: float
    bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds else 0.0

    @property
    def rate_past_burst(self) -> float:
        """The rate without the burst (a second's worth of the quota) it began with."""
        burst = self.quota_bytes_per_sec
        return (self.bytes - burst) / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        quota = self.quota_bytes_per_sec
        return (f"{self.client:<16} {self.direction:<4} quota {quota / MIB:5.2f} MiB/s  "
                f"achieved {self.rate / MIB:5.2f} MiB/s ({self.rate / quota:6.1%}), "
                f"{self.rate_past_burst / MIB:5.2f} MiB/s past the burst "
                f"({self.rate_past_burst / quota:6.1%})  "
                f"{self.bytes / MIB:6.2f} MiB in {self.seconds:.2f} s")


Counter = Callable[[], int]


async def _timed(seconds: float, run: Callable[[list[int]], Awaitable[None]]
                 ) -> tuple[int, float]:
    """Run ``run(moved)`` for ``seconds``; ``moved[0]`` is what it counted by then."""
    moved = [0]
    start = trio.current_time()
    with trio.move_on_after(seconds):
        await run(moved)
    return moved[0], trio.current_time() - start


async def figg_publisher(server: ServerInfo, seconds: float, size: int, window: int
                         ) -> tuple[int, float]:
    assert server.figg is not None
    value = os.urandom(size)
    async with open_figg_client(*server.figg, window=window) as client:

        async def run(moved: list[int]) -> None:
            def acked(_: int) -> None:
                moved[0] += size

            while True:
                await client.publish("quota-figg", value, acked)

        return await _timed(seconds, run)


async def tank_producer(server: ServerInfo, seconds: float, size: int
                        ) -> tuple[int, float]:
    assert server.tank is not None
    async with open_tank_client(*server.tank) as client:

        async def run(moved: list[int]) -> None:
            async def produce() -> None:
                batch = [os.urandom(size) for _ in range(4)]
                while True:
                    await client.produce({("quota-tank", 0): batch})
                    moved[0] += size * len(batch)

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(produce)

        return await _timed(seconds, run)


async def tank_consumer(server: ServerInfo, seconds: float) -> tuple[int, float]:
    assert server.tank is not None
    async with open_tank_client(*server.tank) as client:

        async def run(moved: list[int]) -> None:
            seq = 1
            while True:
                result = await client.consume(HISTORY, 0, seq, fetch_size=256 * 1024)
                moved[0] += sum(len(m.value) for m in result.messages)
                seq = result.next_seq

        return await _timed(seconds, run)


async def figg_subscriber(server: ServerInfo, seconds: float) -> tuple[int, float]:
    assert server.figg is not None
    async with open_figg_client(*server.figg) as client:
        sub = await client.subscribe(HISTORY, from_offset=0)

        async def run(moved: list[int]) -> None:
            async for message in sub:
                moved[0] += len(message.data)

        return await _timed(seconds, run)


async def fill(server: ServerInfo, total: int, size: int) -> None:
    """Append ``total`` bytes of incompressible messages to the history topic."""
    assert server.tank is not None
    async with open_tank_client(*server.tank) as client:
        for _ in range(0, total, 64 * size):
            await client.produce({(HISTORY, 0): [os.urandom(size) for _ in range(64)]})


async def run_bench(rate: float, seconds: float, size: int, window: int, data_dir: Path,
                    *, pause: float = 1.5) -> list[Result]:
    """Run the four clients in turn; ``pause``: seconds between two (the last one's debt
    is paid and its connection gone, so the next starts with a full burst)."""
    settings = Settings(data_dir=data_dir, durability="os", figg_listen="127.0.0.1:0",
                        tank_listen="127.0.0.1:0", metrics_listen="", kafka_listen="",
                        http_listen="")
    async with open_server(settings, grace=0.5) as server:
        await fill(server, int(rate * seconds * 2 + 2 * MIB), size)
        server.quotas.replace_rules(parse_quotas([{
            "who": ["*"], "bytes_in_per_sec": rate, "bytes_out_per_sec": rate}]))
        results = []
        for client, direction, measure in (
                ("figg publisher", "in", figg_publisher(server, seconds, size, window)),
                ("tank producer", "in", tank_producer(server, seconds, size)),
                ("tank consumer", "out", tank_consumer(server, seconds)),
                ("figg subscriber", "out", figg_subscriber(server, seconds))):
            moved, elapsed = await measure
            results.append(Result(client, direction, rate, moved, elapsed))
            await trio.sleep(pause)
        server.quotas.replace_rules(QuotaRules())
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.quota",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1.0,
                        help="the quota, MiB/s in and out (default 1)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long each client runs (default 10)")
    parser.add_argument("--size", type=int, default=16 * 1024,
                        help="bytes per message (default 16384)")
    parser.add_argument("--window", type=int, default=64,
                        help="the Figg publisher's window (default 64: 1 MiB in flight; the "
                        "client pings in-band, so what it has in flight should drain at the "
                        "quota within its ping timeout)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or args.size <= 0 or args.window <= 0:
        parser.error("--rate, --seconds, --size and --window must be positive")
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="figtank-quota-bench-") as tmp:
        results = trio.run(run_bench, args.rate * MIB, args.seconds, args.size,
                           args.window, Path(tmp) / "data")
    if args.json:
        report: dict[str, Any] = {
            "rate_bytes_per_sec": args.rate * MIB, "seconds": args.seconds,
            "message_bytes": args.size,
            "results": [{**asdict(r), "achieved_bytes_per_sec": r.rate,
                         "past_burst_bytes_per_sec": r.rate_past_burst} for r in results]}
        print(json.dumps(report))
    else:
        for result in results:
            print(result.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
