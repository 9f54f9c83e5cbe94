"""Tank end-to-end benchmarks over loopback against a gateway in its own process.

Run: ``python benchmarks/bench_tank.py [--durability fsync|os] [--bundles 300]
[--consume-mib 256] [--latency-samples 2000] [--in-flight 8]``.

Measured:

- produce: bundles of 1000 messages of 100 bytes, ``--in-flight`` Produce requests
  pipelined on one connection; msgs/s and MB/s of message bytes, from the first request
  to the last answer. Once with the client encoding each bundle (``produce``, Snappy by
  Tank's rule since a bundle has > 512 messages) and once with bundles encoded beforehand
  (``produce_bundles``: what the gateway itself sustains);
- consume: a partition holding ``--consume-mib`` MiB of 1 KiB messages (bundles of 100,
  incompressible) read from sequence 1 with a 1 MiB fetch size, one Consume at a time;
  MB/s of message bytes with the client decoding every message, and MB/s of chunk bytes
  with the response framing decoded only (the listener's ``sendfile`` path);
- latency: a consumer long-polls the tail; a producer on another connection sends one
  100-byte message; the time from calling produce to the consumer holding the message
  (median and p99 over ``--latency-samples``), one message at a time.

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
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.client.tank import TAIL, TankClient, open_tank_client  # noqa: E402
from protocols.connection import NEED_DATA, Role  # noqa: E402
from protocols.tank.bundle import Message, encode_bundle, iter_framed_bundles  # noqa: E402
from protocols.tank.connection import TankConnection  # noqa: E402
from protocols.tank.messages import (  # noqa: E402
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
)

MB = 1_000_000


# ----------------------------------------------------------------------- the server


async def serve(data_dir: str, durability: str) -> None:
    """``--serve``: the Tank listener on the embedded store; prints its port."""
    from gateway.config import Settings
    from gateway.embedded import open_embedded_backend
    from gateway.logs import configure_logging
    from gateway.metrics import Metrics
    from gateway.tank_listener import serve_tank

    settings = Settings().with_overrides(data_dir=data_dir, durability=durability,
                                         tank_listen="127.0.0.1:0", figg_listen="",
                                         metrics_listen="", log_level="warning")
    configure_logging("warning", "json")
    metrics = Metrics()
    async with open_embedded_backend(settings, metrics) as backend, \
            trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_tank, backend, settings, metrics)
        print(listeners[0].socket.getsockname()[1], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def gateway(durability: str) -> Iterator[int]:
    """Start the gateway in a child process; yields its Tank port."""
    with tempfile.TemporaryDirectory(prefix="bench-tank-") as data_dir:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", data_dir, "--durability", durability],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the gateway did not start")
            yield int(line)
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


# ------------------------------------------------------------------ measurements


def batch(count: int, size: int, seed: int) -> list[Message]:
    """``count`` distinct messages of ``size`` bytes (compressible like real records)."""
    now = time.time_ns() // 1_000_000
    body = (b"%08d" % seed) * (size // 8 + 1)
    return [Message(b"%06d" % i + body[:size - 6], timestamp=now) for i in range(count)]


async def pipelined(count: int, in_flight: int, one: Callable[[int], Awaitable[None]]
                    ) -> float:
    """Seconds to run ``await one(i)`` for ``i < count``, ``in_flight`` at a time."""
    slots = trio.Semaphore(in_flight)

    async def run(i: int) -> None:
        try:
            await one(i)
        finally:
            slots.release()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(count):
            await slots.acquire()
            nursery.start_soon(run, i)
    return time.perf_counter() - start


async def bench_produce(port: int, bundles: int, in_flight: int, encode: bool
                        ) -> tuple[float, float]:
    """msgs/s and MB/s for ``bundles`` Produce requests of 1000 x 100 B."""
    topic = "produce-enc" if encode else "produce-pre"
    batches = [batch(1000, 100, i) for i in range(16)]
    encoded = [encode_bundle(b) for b in batches]
    async with open_tank_client("127.0.0.1", port) as client:
        await client.produce({(topic, 0): [b"warm-up"]})

        async def one(i: int) -> None:
            if encode:
                await client.produce({(topic, 0): batches[i % 16]})
            else:
                await client.produce_bundles({(topic, 0): encoded[i % 16]})

        elapsed = await pipelined(bundles, in_flight, one)
    messages = bundles * 1000
    return messages / elapsed, messages * 100 / elapsed / MB


async def fill(client: TankClient, topic: str, mib: int) -> int:
    """Append ``mib`` MiB of 1 KiB incompressible messages in bundles of 100."""
    count = mib * 1024
    pool = os.urandom(1024 * 1024)
    now = time.time_ns() // 1_000_000
    for start in range(0, count, 100):
        offset = (start * 1024) % (len(pool) - 100 * 1024)
        messages = [Message(pool[offset + i * 1024:offset + (i + 1) * 1024], timestamp=now)
                    for i in range(100)]
        await client.produce({(topic, 0): messages})
    return count


async def bench_consume(port: int, mib: int) -> tuple[float, float]:
    """MB/s of message bytes decoded by the client, and of raw chunk bytes."""
    topic = "consume"
    async with open_tank_client("127.0.0.1", port) as client:
        count = await fill(client, topic, mib)
        seq, got, size = 1, 0, 0
        start = time.perf_counter()
        while got < count:
            result = await client.consume(topic, 0, seq, fetch_size=1024 * 1024)
            got += len(result.messages)
            size += sum(len(m.value) for m in result.messages)
            seq = result.next_seq
        decoded = size / (time.perf_counter() - start) / MB
    raw = await raw_consume(port, topic, count)
    return decoded, raw


async def raw_consume(port: int, topic: str, count: int) -> float:
    """MB/s of chunk bytes, the response framing decoded but not the bundles."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    conn = TankConnection(Role.CLIENT, max_frame_size=256 * 1024 * 1024)
    seq, chunk_bytes, request_id = 1, 0, 0
    start = time.perf_counter()
    while seq <= count:
        request_id += 1
        await stream.send_all(conn.send(ConsumeRequest(
            2, request_id, "bench", 0, 0, 0,
            [ConsumeTopic(topic, [ConsumePartition(0, seq, 1024 * 1024)])])))
        while True:
            event = conn.next_event()
            if event is NEED_DATA:
                conn.receive_data(await stream.receive_some(1024 * 1024))
                continue
            if hasattr(event, "response"):
                break
        [part] = event.response.topics[0].partitions
        chunk_bytes += len(part.chunk)
        # Bundle headers only: how many messages the chunk held.
        seq = part.base_seq_num + sum(info.msg_count
                                      for _, _, info in iter_framed_bundles(part.chunk))
    elapsed = time.perf_counter() - start
    await stream.aclose()
    return chunk_bytes / elapsed / MB


async def consume_one(consumer: TankClient, topic: str, seq: int, got: list[float]) -> None:
    """Long-poll for ``seq``; note the time it arrived in ``got``."""
    result = await consumer.consume(topic, 0, seq, max_wait_ms=10_000)
    got.append(time.perf_counter())
    if not result.messages:
        raise RuntimeError("the consumer timed out")


async def bench_latency(port: int, samples: int) -> tuple[float, float]:
    """Median and p99 seconds from produce() to a waiting consumer holding the message."""
    topic = "latency"
    latencies: list[float] = []
    async with open_tank_client("127.0.0.1", port) as producer, \
            open_tank_client("127.0.0.1", port) as consumer:
        await producer.produce({(topic, 0): [b"warm-up"]})
        first = await consumer.consume(topic, 0, TAIL)
        next_seq = first.next_seq
        for i in range(samples):
            got: list[float] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume_one, consumer, topic, next_seq, got)
                await trio.sleep(0.001)  # the Consume is parked at the broker
                sent = time.perf_counter()
                await producer.produce({(topic, 0): [b"%08d" % i + b"." * 92]})
            latencies.append(got[0] - sent)
            next_seq += 1
    return statistics.median(latencies), percentile(latencies, 0.99)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--durability", choices=("fsync", "os"), default="fsync")
    parser.add_argument("--bundles", type=int, default=300,
                        help="Produce requests of 1000 x 100 B per produce run")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--consume-mib", type=int, default=256)
    parser.add_argument("--latency-samples", type=int, default=2000)
    parser.add_argument("--serve", metavar="DATA_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(serve, args.serve, args.durability)
        return
    print(f"durability={args.durability}")
    with gateway(args.durability) as port:
        for encode in (True, False):
            rate, mbps = trio.run(bench_produce, port, args.bundles, args.in_flight, encode)
            how = "client encodes" if encode else "pre-encoded"
            print(f"produce 100 B x 1000/bundle ({how}, {args.in_flight} in flight): "
                  f"{rate:,.0f} msgs/s, {mbps:.1f} MB/s")
    with gateway(args.durability) as port:
        decoded, raw = trio.run(bench_consume, port, args.consume_mib)
        print(f"consume 1 KiB messages ({args.consume_mib} MiB): {decoded:.0f} MB/s decoded "
              f"by the client, {raw:.0f} MB/s of chunks")
    with gateway(args.durability) as port:
        median, p99 = trio.run(bench_latency, port, args.latency_samples)
        print(f"latency produce -> waiting consumer: median {median * 1e3:.2f} ms, "
              f"p99 {p99 * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
