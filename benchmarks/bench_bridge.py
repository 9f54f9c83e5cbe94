"""Bridge-mode benchmarks: Figg through a bridge figtank against Figg straight to the
embedded figtank behind it, same machine, same run.

Run: ``python benchmarks/bench_bridge.py [--messages N] [--size 128] [--window 256]
[--durability fsync|os] [--rounds 3] [--publishers 4] [--subscribers 4]
[--latency-samples 1000]``.

Two child processes: the upstream (an embedded figtank with Figg and Tank listeners on a
temporary data directory) and the bridge (a figtank whose backend is the upstream's Tank
listener). Every measurement runs once against each, on its own topic:

- publish: one Figg client publishes ``--messages`` messages of ``--size`` bytes with a
  window of ``--window``; msgs/s from the first PUBLISH to the last ACK. ``--rounds``
  alternating rounds, median reported;
- parallel publish: ``--publishers`` client processes at once on one topic, rates summed;
- subscribe: ``--subscribers`` client processes attach from offset 0 to a topic holding
  ``--messages`` messages and read them all (through the bridge, subscribers at the same
  position share the upstream Consume); total msgs/s;
- ACK latency: ``publish_and_wait`` one message at a time, median and p99.

Nothing but 127.0.0.1 is used.
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


# ---------------------------------------------------------------------- the servers


async def serve(data_dir: str, durability: str, upstream_port: int | None) -> None:
    """``--serve``: the embedded gateway (no upstream) or a bridge; prints its ports."""
    from gateway.config import Settings
    from gateway.embedded import open_embedded_backend
    from gateway.figg_listener import serve_figg
    from gateway.logs import configure_logging
    from gateway.metrics import Metrics
    from gateway.tank_listener import serve_tank

    settings = Settings().with_overrides(
        data_dir=data_dir, durability=durability, figg_listen="127.0.0.1:0",
        tank_listen="127.0.0.1:0", metrics_listen="", log_level="warning",
        upstream=[f"127.0.0.1:{upstream_port}"] if upstream_port else [])
    configure_logging("warning", "json")
    metrics = Metrics()
    if upstream_port:
        from gateway.bridge import open_bridge_backend
        opened = open_bridge_backend(settings, metrics)
    else:
        opened = open_embedded_backend(settings, metrics)
    async with opened as backend, trio.open_nursery() as nursery:
        figg = await nursery.start(serve_figg, backend, settings, metrics)
        tank = await nursery.start(serve_tank, backend, settings, metrics)
        print(f"figg={figg[0].socket.getsockname()[1]} "
              f"tank={tank[0].socket.getsockname()[1]}", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def server(data_dir: str, durability: str, upstream_port: int = 0) -> Iterator[dict[str, int]]:
    """Start a gateway in a child process; yields its ports by protocol."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", data_dir, "--durability", durability,
         "--upstream-port", str(upstream_port)],
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


async def publish(port: int, topic: str, messages: int, size: int, window: int
                  ) -> tuple[float, float]:
    """``(start, end)`` wall-clock times of ``messages`` publishes, first PUBLISH to last
    ACK (the topic is created before the clock starts)."""
    data = os.urandom(size)
    async with open_figg_client("127.0.0.1", port, window=window, **OPTIONS) as client:
        await client.wait_connected()
        await client.publish_and_wait(topic, data)
        start = time.time()
        for _ in range(messages):
            await client.publish(topic, data)
        await client.wait_all_acked()
        return start, time.time()


async def read_all(port: int, topic: str, messages: int) -> tuple[float, float]:
    """Read ``messages`` messages of ``topic`` from offset 0: wall-clock ``(start, end)``."""
    async with open_figg_client("127.0.0.1", port, **OPTIONS) as client:
        sub = await client.subscribe(topic, from_offset=0, buffer=65536)
        start = time.time()
        count = 0
        async for _ in sub:
            count += 1
            if count == messages:
                break
        return start, time.time()


def in_processes(role: str, count: int, *args: object) -> float:
    """Run ``count`` child processes of ``role`` at once; the span from the first start to
    the last end."""
    procs = [subprocess.Popen([sys.executable, __file__, role, *map(str, args)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(count)]
    spans = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        start, end = out.split()
        spans.append((float(start), float(end)))
    return max(e for _, e in spans) - min(s for s, _ in spans)


async def ack_latency(port: int, topic: str, samples: int, size: int) -> tuple[float, float]:
    """Median and p99 seconds of ``publish_and_wait``, one message at a time."""
    data = b"." * size
    latencies = []
    async with open_figg_client("127.0.0.1", port, **OPTIONS) as client:
        await client.publish_and_wait(topic, data)
        for _ in range(samples):
            sent = time.perf_counter()
            await client.publish_and_wait(topic, data)
            latencies.append(time.perf_counter() - sent)
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


# ----------------------------------------------------------------------------- main


def row(what: str, direct: float, bridge: float, unit: str) -> None:
    print(f"{what:<30} {direct:>12,.0f} {bridge:>12,.0f}  {unit:<9} {bridge / direct:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--durability", choices=("fsync", "os"), default="fsync")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--subscribers", type=int, default=4)
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--serve", metavar="DATA_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--publisher", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--subscriber", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(serve, args.serve, args.durability, args.upstream_port)
        return
    if args.publisher:
        port, topic, count, size, window = args.publisher
        print(*trio.run(publish, int(port), topic, int(count), int(size), int(window)))
        return
    if args.subscriber:
        port, topic, count = args.subscriber
        print(*trio.run(read_all, int(port), topic, int(count)))
        return

    n, size = args.messages, args.size
    print(f"bridge bench: {n} messages of {size} B, window {args.window}, upstream durability "
          f"{args.durability}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-bridge-") as data_dir, \
            server(data_dir, args.durability) as up, \
            server(data_dir, args.durability, up["tank"]) as bridge:
        ports = {"direct": up["figg"], "bridge": bridge["figg"]}
        print(f"{'':<30} {'direct':>12} {'bridge':>12}  {'':<9} bridge/direct")
        rates: dict[str, list[float]] = {"direct": [], "bridge": []}
        for r in range(args.rounds):
            for name, port in ports.items():
                start, end = trio.run(publish, port, f"pub-{name}-{r}", n, size, args.window)
                rates[name].append(n / (end - start))
        row("publish, 1 client", statistics.median(rates["direct"]),
            statistics.median(rates["bridge"]), "msgs/s")

        each = n // args.publishers
        parallel = {name: each * args.publishers / in_processes(
            "--publisher", args.publishers, port, f"par-{name}", each, size, args.window)
            for name, port in ports.items()}
        row(f"publish, {args.publishers} clients (total)", parallel["direct"],
            parallel["bridge"], "msgs/s")

        # Both read the same topic, written once, so they read the same bytes.
        total = n + 1
        one = {name: total / in_processes("--subscriber", 1, port, "pub-direct-0", total)
               for name, port in ports.items()}
        row("subscribe, 1 client", one["direct"], one["bridge"], "msgs/s")
        many = {name: total * args.subscribers / in_processes(
            "--subscriber", args.subscribers, port, "pub-direct-0", total)
            for name, port in ports.items()}
        row(f"subscribe, {args.subscribers} clients (total)", many["direct"], many["bridge"],
            "msgs/s")

        latency = {name: trio.run(ack_latency, port, f"lat-{name}", args.latency_samples,
                                  size) for name, port in ports.items()}
        row("ACK latency median", latency["direct"][0] * 1e6, latency["bridge"][0] * 1e6, "us")
        row("ACK latency p99", latency["direct"][1] * 1e6, latency["bridge"][1] * 1e6, "us")


if __name__ == "__main__":
    main()
