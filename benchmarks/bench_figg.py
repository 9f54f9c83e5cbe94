"""Figg end-to-end benchmarks over loopback against a gateway in its own process.

Run: ``python benchmarks/bench_figg.py [--messages N] [--size 128] [--window 256]
[--durability fsync|os] [--subscribers 1 4] [--latency-samples 2000]``.

Measured:

- publish: one Figg client publishes ``--messages`` messages of ``--size`` bytes with a
  window of ``--window``; msgs/s from the first PUBLISH to the last ACK; then
  ``--publishers`` clients (processes) at once on one topic, their rates summed;
- subscribe: 1 and 4 subscribers (each its own process) attach from offset 0 to a topic
  holding ``--messages`` messages and read them all; msgs/s per subscriber and in total;
- latency: Figg PUBLISH -> a Tank consumer long-polling the same partition (median and
  p99 over ``--latency-samples`` messages sent one at a time).

The gateway runs in a child process started by this script (``--serve``) on a temporary
data directory; nothing but 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.client.figg import open_figg_client  # noqa: E402

OPTIONS = {"ping_interval": 5.0}


# ----------------------------------------------------------------------- the server


async def serve(data_dir: str, durability: str) -> None:
    """``--serve``: the gateway's listeners on the embedded store; prints the ports."""
    from gateway.config import Settings
    from gateway.embedded import open_embedded_backend
    from gateway.figg_listener import serve_figg
    from gateway.logs import configure_logging
    from gateway.metrics import Metrics
    from gateway.tank_listener import serve_tank

    settings = Settings().with_overrides(data_dir=data_dir, durability=durability,
                                         figg_listen="127.0.0.1:0",
                                         tank_listen="127.0.0.1:0", metrics_listen="",
                                         log_level="warning")
    configure_logging("warning", "json")
    metrics = Metrics()
    async with open_embedded_backend(settings, metrics) as backend, \
            trio.open_nursery() as nursery:
        figg = await nursery.start(serve_figg, backend, settings, metrics)
        tank = await nursery.start(serve_tank, backend, settings, metrics)
        print(f"figg={figg[0].socket.getsockname()[1]} "
              f"tank={tank[0].socket.getsockname()[1]}", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def gateway(durability: str) -> Iterator[dict[str, int]]:
    """Start the gateway in a child process; yields its ports by protocol."""
    with tempfile.TemporaryDirectory(prefix="bench-figg-") as data_dir:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", data_dir, "--durability", durability],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the gateway did not start")
            yield {k: int(v) for k, v in (p.split("=") for p in line.split())}
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


# ------------------------------------------------------------------ measurements


async def bench_publish(port: int, topic: str, messages: int, size: int, window: int
                        ) -> tuple[float, float]:
    """``(start, end)`` wall-clock times of ``messages`` publishes of ``size`` bytes, from
    the first PUBLISH to the last ACK."""
    data = os.urandom(size)
    async with open_figg_client("127.0.0.1", port, window=window, **OPTIONS) as client:
        await client.wait_connected()
        await client.publish_and_wait(topic, data)  # creates the topic
        start = time.time()
        for _ in range(messages):
            await client.publish(topic, data)
        await client.wait_all_acked()
        return start, time.time()


def bench_publish_parallel(port: int, topic: str, messages: int, size: int, window: int,
                           publishers: int) -> float:
    """Total msgs/s of ``publishers`` processes each publishing ``messages // publishers``,
    over the wall-clock span from the first start to the last end."""
    each = messages // publishers
    procs = [subprocess.Popen([sys.executable, __file__, "--publisher", str(port), topic,
                               str(each), str(size), str(window)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(publishers)]
    spans = [_span(proc) for proc in procs]
    return each * publishers / (max(e for _, e in spans) - min(s for s, _ in spans))


def _span(proc: subprocess.Popen[str]) -> tuple[float, float]:
    out, _ = proc.communicate(timeout=600)
    start, end = out.split()
    return float(start), float(end)


async def read_all(port: int, topic: str, messages: int) -> tuple[float, float]:
    """``--subscriber``: read ``messages`` messages of ``topic`` from offset 0; returns
    the wall-clock ``(start, end)``."""
    async with open_figg_client("127.0.0.1", port, **OPTIONS) as client:
        sub = await client.subscribe(topic, from_offset=0, buffer=65536)
        start = time.time()
        count = 0
        async for _ in sub:
            count += 1
            if count == messages:
                break
        return start, time.time()


def bench_subscribe(port: int, topic: str, messages: int, subscribers: int
                    ) -> tuple[list[float], float]:
    """Start ``subscribers`` processes reading the whole topic at once: each one's msgs/s,
    and the total over the span from the first start to the last end."""
    procs = [subprocess.Popen([sys.executable, __file__, "--subscriber", str(port), topic,
                               str(messages)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(subscribers)]
    spans = [_span(proc) for proc in procs]
    total = messages * subscribers / (max(e for _, e in spans) - min(s for s, _ in spans))
    return [messages / (e - s) for s, e in spans], total


async def bench_latency(figg_port: int, tank_port: int, samples: int, size: int
                        ) -> tuple[float, float]:
    """Median and p99 seconds from a Figg PUBLISH to a Tank consumer receiving it.

    One message at a time: the publisher sends the next once the consumer has the last,
    so each sample is an idle-system latency (durability included: under ``fsync`` a
    message becomes visible once fsynced).
    """
    from gateway.client.tank import open_tank_client

    topic = "latency"
    pad = b"." * max(0, size - 8)
    latencies: list[float] = []
    async with open_figg_client("127.0.0.1", figg_port, **OPTIONS) as figg, \
            open_tank_client("127.0.0.1", tank_port) as tank:
        await figg.publish_and_wait(topic, b"warm-up")
        [bounds] = await tank.discover_partitions(topic)
        next_seq = bounds.high_water_mark + 1
        for i in range(samples):
            sent = time.perf_counter()
            await figg.publish(topic, i.to_bytes(8, "big") + pad)
            while True:
                result = await tank.consume(topic, 0, next_seq, max_wait_ms=5000,
                                            min_bytes=1)
                next_seq = result.next_seq
                if any(m.value[:8] == i.to_bytes(8, "big") for m in result.messages):
                    break
            latencies.append(time.perf_counter() - sent)
    return statistics.median(latencies), percentile(latencies, 0.99)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--durability", choices=("fsync", "os"), default="fsync")
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--publishers", type=int, nargs="+", default=[4],
                        help="also measure this many publishers at once (aggregate)")
    parser.add_argument("--latency-samples", type=int, default=2000)
    parser.add_argument("--serve", metavar="DATA_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--subscriber", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--publisher", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(serve, args.serve, args.durability)
        return
    if args.publisher:
        port, topic, count, size, window = args.publisher
        print(*trio.run(bench_publish, int(port), topic, int(count), int(size), int(window)))
        return
    if args.subscriber:
        port, topic, count = args.subscriber
        print(*trio.run(read_all, int(port), topic, int(count)))
        return

    print(f"figg bench: {args.messages} messages of {args.size} B, window {args.window}, "
          f"durability {args.durability}, {os.cpu_count()} CPUs")
    with gateway(args.durability) as ports:
        figg = ports["figg"]
        start, end = trio.run(bench_publish, figg, "bench", args.messages, args.size,
                              args.window)
        rate = args.messages / (end - start)
        print(f"publish    {rate:12,.0f} msgs/s  ({rate * args.size / 1e6:.1f} MB/s of payload)")
        for n in args.publishers:
            total_rate = bench_publish_parallel(figg, f"bench-{n}", args.messages, args.size,
                                                args.window, n)
            print(f"publish    {total_rate:12,.0f} msgs/s total ({n} publishers at once, "
                  f"one topic)")
        total = args.messages + 1
        for n in args.subscribers:
            rates, aggregate = bench_subscribe(figg, "bench", total, n)
            print(f"subscribe  {statistics.mean(rates):12,.0f} msgs/s per subscriber, "
                  f"{aggregate:,.0f} msgs/s total ({n} subscriber{'s' if n > 1 else ''})")
        median, p99 = trio.run(bench_latency, figg, ports["tank"], args.latency_samples,
                               args.size)
        print(f"latency    Figg publish -> Tank consumer: median {median * 1e3:.2f} ms, "
              f"p99 {p99 * 1e3:.2f} ms ({args.latency_samples} messages, one at a time)")


if __name__ == "__main__":
    main()
