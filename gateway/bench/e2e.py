"""``e2e``: publish over one protocol, receive over the other (and the same).

Messages go out at a fixed offered rate, each stamped with the time it was due (not the
time it went out, so a late generator counts against the figure instead of hiding it); the
receiver subtracts that stamp from the time it holds the message.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Final

import trio

from gateway.bench.endpoints import (
    bounds,
    ensure_topic,
    figg_client,
    tank_client,
    unique_topic,
)
from gateway.bench.payload import HEADER_SIZE, Payloads, Tally
from gateway.bench.procs import Share, WorkerResult
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report, samples, total
from gateway.bench.stall import cancel_when_stalled
from gateway.bench.stats import summarize
from gateway.client.errors import TankError
from gateway.client.figg import FiggClient, Subscription
from gateway.client.tank import TankClient
from protocols.tank.bundle import Codec, Message, encode_bundle

#: ``publisher-receiver`` protocol pairs.
PATHS: Final = ("figg-tank", "tank-figg", "figg-figg", "tank-tank")
#: How long a Tank receiver's Consume waits at the broker for new messages.
_LONG_POLL_MS: Final = 1000

SendBatch = Callable[[int, int], Awaitable[None]]


@dataclass
class _PathResult:
    tally: Tally
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    lag_ns: int = 0
    failed: int = 0


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="messages per second offered (in all, per path)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per path")
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                        metavar="PATH", help=f"publisher-receiver pairs (default: all of "
                                             f"{', '.join(PATHS)})")
    parser.add_argument("--window", type=int, default=256,
                        help="unacknowledged publishes of a Figg publisher")
    parser.add_argument("--stall", type=float, default=10.0,
                        help="seconds without a message after which a path gives up")


def _params(args: argparse.Namespace) -> Params:
    if args.size < HEADER_SIZE:
        raise ValueError(f"--size must be at least {HEADER_SIZE}")
    if args.rate <= 0 or args.duration <= 0:
        raise ValueError("--rate and --duration must be positive")
    return {"rate": args.rate, "duration": args.duration, "size": args.size,
            "paths": list(dict.fromkeys(args.paths)), "window": args.window,
            "stall": args.stall, "messages": round(args.rate * args.duration)}


async def _prepare(params: Params) -> Params:
    return {**params, "topic": params["topic"] or unique_topic("bench-e2e")}


async def _paced(send: SendBatch, count: int, rate: float, t0: int) -> int:
    """Call ``send(i, j)`` for messages ``i..j-1`` as they fall due; the worst lateness
    (ns) of a batch."""
    period = 1e9 / rate
    sent = lag = 0
    while sent < count:
        now = time.monotonic_ns()
        due = min(count, int((now - t0) // period) + 1) if now >= t0 else 0
        if due > sent:
            lag = max(lag, now - (t0 + int(sent * period)))
            await send(sent, due)
            sent = due
        delay = (t0 + int(sent * period) - time.monotonic_ns()) / 1e9
        await trio.sleep(max(0.0, delay))
    return lag


async def _receive_tank(client: TankClient, topic: str, seq: int, out: _PathResult) -> None:
    tally, latencies = out.tally, out.latencies
    while not tally.complete:
        result = await client.consume(topic, 0, seq, max_wait_ms=_LONG_POLL_MS, min_bytes=1)
        now = time.monotonic_ns()
        for message in result.messages:
            stamp = tally.add(message.value)
            if stamp >= 0:
                latencies.append((now - stamp) / 1e9)
        seq = result.next_seq


async def _receive_figg(sub: Subscription, out: _PathResult) -> None:
    tally, latencies = out.tally, out.latencies
    async for message in sub:
        stamp = tally.add(message.data)
        if stamp >= 0:
            latencies.append((time.monotonic_ns() - stamp) / 1e9)
        if tally.complete:
            break


async def _run_path(params: Params, path: str, topic: str, publisher: int, count: int,
                    rate: float) -> _PathResult:
    sender, receiver = path.split("-")
    run = params["run"]
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    out = _PathResult(Tally(run, {publisher: count}))
    period = 1e9 / rate
    async with AsyncExitStack() as stack:
        if "tank" in (sender, receiver):
            admin = await stack.enter_async_context(tank_client(params["tank"]))
            await ensure_topic(admin, topic)
        if receiver == "tank":
            consumer = await stack.enter_async_context(tank_client(params["tank"]))
            _, hwm = await bounds(consumer, topic)

            async def receive() -> None:
                await _receive_tank(consumer, topic, hwm + 1, out)
        else:
            listener = await stack.enter_async_context(figg_client(params["figg"]))
            sub = await listener.subscribe(topic)

            async def receive() -> None:
                await _receive_figg(sub, out)

        t0 = time.monotonic_ns() + 5_000_000
        if sender == "tank":
            producer = await stack.enter_async_context(tank_client(params["tank"]))
            send = _tank_sender(producer, topic, payloads, run, publisher, t0, period, out)
        else:
            figg = await stack.enter_async_context(
                figg_client(params["figg"], window=params["window"]))
            send = _figg_sender(figg, topic, payloads, run, publisher, t0, period)

        def progress() -> int:
            return out.tally.received + out.tally.duplicates

        async with trio.open_nursery() as guard:
            guard.start_soon(cancel_when_stalled, guard.cancel_scope, progress,
                             params["stall"])
            async with trio.open_nursery() as load:
                load.start_soon(receive)
                async with trio.open_nursery() as sending:  # holds in-flight Produces
                    out.lag_ns = await _paced(lambda i, j: send(sending, i, j), count,
                                              rate, t0)
            guard.cancel_scope.cancel()
        out.seconds = (time.monotonic_ns() - t0) / 1e9
    return out


def _tank_sender(client: TankClient, topic: str, payloads: Payloads, run: int,
                 publisher: int, t0: int, period: float, out: _PathResult
                 ) -> Callable[[trio.Nursery, int, int], Awaitable[None]]:
    async def produce(bundle: bytes, count: int) -> None:
        try:
            await client.produce_bundles({(topic, 0): bundle})
        except TankError:
            out.failed += count

    async def send(nursery: trio.Nursery, first: int, end: int) -> None:
        now_ms = time.time_ns() // 1_000_000
        bundle = encode_bundle([
            Message(payloads.stamped(run, publisher, k, t0 + int(k * period)),
                    timestamp=now_ms) for k in range(first, end)], codec=Codec.NONE)
        nursery.start_soon(produce, bundle, end - first)  # pipelined: no wait for the ack
        await trio.lowlevel.checkpoint()

    return send


def _figg_sender(client: FiggClient, topic: str, payloads: Payloads, run: int,
                 publisher: int, t0: int, period: float
                 ) -> Callable[[trio.Nursery, int, int], Awaitable[None]]:
    async def send(_: trio.Nursery, first: int, end: int) -> None:
        for k in range(first, end):
            await client.publish(topic, payloads.stamped(run, publisher, k,
                                                         t0 + int(k * period)))

    return send


async def _work(params: Params, share: Share) -> WorkerResult:
    _, count = share.part(params["messages"])
    rate = params["rate"] * count / max(params["messages"], 1)
    counts: dict[str, int] = {}
    kinds: dict[str, list[float]] = {}
    info: dict[str, float] = {}
    await share.start()
    for path in params["paths"]:
        await share.sync()
        if not count:
            continue
        out = await _run_path(params, path, f"{params['topic']}-{path}-{share.index}",
                              share.index, count, rate)
        counts.update({f"{path}_expected": count, f"{path}_received": out.tally.received,
                       f"{path}_duplicates": out.tally.duplicates,
                       f"{path}_failed": out.failed})
        kinds[path] = out.latencies
        info.update({f"{path}_seconds": out.seconds, f"{path}_lag_ns": out.lag_ns})
    return share.finish(counts, kinds, **info)


async def _finish(params: Params, results: list[WorkerResult]) -> Report:
    rows, checks = [], []
    for path in params["paths"]:
        received = total(results, f"{path}_received")
        seconds = max(r.info.get(f"{path}_seconds", 0.0) for r in results)
        lag = max(r.info.get(f"{path}_lag_ns", 0) for r in results) / 1e6
        failed = total(results, f"{path}_failed")
        label = path.replace("-", "->")
        rows.append(Row(label, received, seconds, received * params["size"],
                        summarize(samples(results, path)), "end-to-end",
                        note=f"offered {params['rate']:,.0f} msgs/s; generator late by "
                             f"{lag:.1f} ms at worst"))
        checks.append(Check(label, total(results, f"{path}_expected"), received,
                            total(results, f"{path}_duplicates"),
                            problem=f"the broker refused {failed:,}" if failed else ""))
    notes = ["latency: from the time a message was due (its stamp) to the receiver "
             "holding it; each path on a topic of its own, one after the other"]
    return make_report("e2e", params, results, rows, checks, notes)


SCENARIO = Scenario("e2e", "publish over one protocol, receive over the other (and the "
                    "same) at a fixed offered rate: latency percentiles", _add_arguments,
                    _params, _work, _finish, _prepare, frozenset({"tank", "figg"}))
