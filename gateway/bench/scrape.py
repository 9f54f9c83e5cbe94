"""What ``/metrics`` scrapes cost the other clients: Figg PING round trips while scrapers
fetch ``/metrics`` back to back, against a ``figtank serve`` holding many topics.

    python -m gateway.bench.scrape --topics 3000 --scrapers 20 --seconds 5

It starts ``figtank serve`` on a temporary store (extra flags after ``--`` go to it),
publishes one message to each of ``--topics`` topics (auto-created; each gets its per-topic
series), then measures PING latency first with no scraper, then while ``--scrapers``
connections (in a child process, so their reading does not slow the pinger) each fetch
``/metrics`` one after another. It prints the latency percentiles of both phases, the
scrapes done and the size of one answer.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from gateway.bench.serving import start_serve
from gateway.client.figg import open_figg_client
from gateway.core.config import parse_address
from protocols.figg.records import encode_ping_frame

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

_PONG = 16  # header (type u16, version u16, length u32) and the echoed u64


def _scrape_loop(address: tuple[str, int], until: float, counts: list[int],
                 sizes: list[int]) -> None:
    connection = http.client.HTTPConnection(*address, timeout=30)
    while time.monotonic() < until:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"/metrics answered {response.status}")
        counts.append(1)
        sizes.append(len(body))
    connection.close()


def run_scrapers(address: tuple[str, int], scrapers: int, seconds: float,
                 result: Queue[tuple[int, int]]) -> None:
    """``scrapers`` threads scraping back to back for ``seconds`` (in a child process);
    ``result`` (a queue) gets ``(scrapes, size of the last answer)``."""
    until = time.monotonic() + seconds
    counts: list[int] = []
    sizes: list[int] = [0]
    threads = [threading.Thread(target=_scrape_loop, args=(address, until, counts, sizes))
               for _ in range(scrapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.put((len(counts), sizes[-1]))


async def ping_latencies(address: tuple[str, int], seconds: float,
                         interval: float = 0.002) -> list[float]:
    """Round trips (seconds) of one PING at a time for ``seconds``."""
    stream = await trio.open_tcp_stream(*address)
    latencies = []
    async with stream:
        until = trio.current_time() + seconds
        while trio.current_time() < until:
            began = time.perf_counter()
            await stream.send_all(encode_ping_frame(1))
            got = b""
            while len(got) < _PONG:
                data = await stream.receive_some(_PONG - len(got))
                if not data:
                    raise RuntimeError("the server closed the pinging connection")
                got += data
            latencies.append(time.perf_counter() - began)
            if struct.unpack_from(">H", got)[0] != 9:
                raise RuntimeError(f"expected a PONG, got {got!r}")
            await trio.sleep(interval)
    return latencies


async def create_topics(figg: tuple[str, int], count: int) -> None:
    """One message published to each of ``count`` topics (auto-creating them)."""
    async with open_figg_client(*figg, window=1024) as client:
        for i in range(count):
            await client.publish(f"scrape-bench-{i:05d}", b"x")
        await client.wait_all_acked()


def _summary(name: str, latencies: list[float]) -> str:
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return (f"{name}: {len(ordered)} pings, p50 {at(0.5):.2f} ms, p99 {at(0.99):.2f} ms, "
            f"max {ordered[-1] * 1000:.2f} ms")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.scrape",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=3000)
    parser.add_argument("--scrapers", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--metric-topics", type=int, default=None,
                        help="limits.metric_topics of the server (default: its default)")
    parser.add_argument("serve_flags", nargs="*", help="after --: flags for figtank serve")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="figtank-scrape-") as scratch:
        flags = list(args.serve_flags)
        if args.metric_topics is not None:
            config = Path(scratch, "figtank.toml")
            config.write_text(f"[limits]\nmetric_topics = {args.metric_topics}\n")
            flags += ["--config", str(config)]
        process, event, _ = start_serve(
            ["--data-dir", str(Path(scratch, "data")), "--durability", "os",
             "--tank-listen", "", "--figg-listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", *flags])
        try:
            figg, metrics = parse_address(event["figg"]), parse_address(event["metrics"])
            began = time.monotonic()
            trio.run(create_topics, figg, args.topics)
            print(f"{args.topics} topics created in {time.monotonic() - began:.1f} s")
            idle = trio.run(ping_latencies, figg, args.seconds)
            context = multiprocessing.get_context("spawn")
            result = context.Queue()
            child = context.Process(target=run_scrapers,
                                    args=(metrics, args.scrapers, args.seconds + 1, result))
            child.start()
            time.sleep(0.5)  # the scrapers are running
            loaded = trio.run(ping_latencies, figg, args.seconds)
            scrapes, size = result.get(timeout=120)
            child.join()
            print(_summary("no scraper", idle))
            print(_summary(f"{args.scrapers} scrapers", loaded))
            print(f"{scrapes} scrapes in {args.seconds + 1:.0f} s, {size} bytes each")
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


if __name__ == "__main__":
    main()
