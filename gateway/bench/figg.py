"""Figg scenarios: ``figg-publish`` and ``figg-subscribe``."""

from __future__ import annotations

import argparse
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Unpack

import trio

from gateway.bench.endpoints import figg_client, unique_topic
from gateway.bench.payload import HEADER_SIZE, Payloads, Tally
from gateway.bench.procs import Share, WorkerResult
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report, samples, total, wall
from gateway.bench.stall import cancel_when_stalled
from gateway.bench.stats import stride, summarize
from gateway.client.figg import FiggClient, FiggOptions, Subscription

#: Latency samples kept per client (every k-th message, k chosen to stay near this).
SAMPLE_CAP = 20_000
#: Messages a subscription may buffer in the client.
SUBSCRIPTION_BUFFER = 16_384


def publisher_counts(messages: int, publishers: int) -> dict[int, int]:
    """How many of ``messages`` each publisher sends."""
    base, extra = divmod(messages, publishers)
    return {p: base + (1 if p < extra else 0) for p in range(publishers)}


@dataclass
class Published:
    """What one publisher did."""

    sent: int = 0
    acked: int = 0
    reconnects: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)


async def publish_stamped(client: FiggClient, topic: str, payloads: Payloads, run: int,
                          publisher: int, count: int, out: Published | None = None
                          ) -> Published:
    """Publish ``count`` stamped messages through the client's window and wait for every
    ACK; sampled ACK latencies are from handing the PUBLISH to the client to its ACK.
    ``out.sent`` counts up as it goes."""
    out = out or Published()
    every = stride(count, SAMPLE_CAP)
    handed: dict[int, float] = {}
    latencies = out.latencies
    perf = time.perf_counter

    def on_ack(seq: int) -> None:
        latencies.append(perf() - handed.pop(seq))

    connections = client.connections
    start = perf()
    try:
        for i in range(count):
            data = payloads.stamped(run, publisher, i, time.monotonic_ns())
            if i % every:
                await client.publish(topic, data)
            else:
                # No checkpoint between publish() returning and the store: the ACK can
                # not be handled before its send time is known.
                seq = await client.publish(topic, data, on_ack)
                handed[seq] = perf()
            out.sent += 1
        await client.wait_all_acked()
    finally:  # also when a stalled run is cancelled: what got through so far
        out.seconds = perf() - start
        out.acked = out.sent - client.unacked
        out.reconnects = client.connections - connections
    return out


def _size(args: argparse.Namespace) -> int:
    if args.size < HEADER_SIZE:
        raise ValueError(f"--size must be at least {HEADER_SIZE} (the stamp the checks "
                         "and latencies need)")
    size: int = args.size
    return size


# ----------------------------------------------------------------------- figg-publish


def _add_publish_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=200_000, help="messages in all")
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--window", type=int, default=256,
                        help="unacknowledged publishes per publisher (the Figg client's)")
    parser.add_argument("--publishers", type=int, default=1,
                        help="publishers (connections), spread over --procs")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip reading the messages back to check them")


def _publish_params(args: argparse.Namespace) -> Params:
    if args.publishers < args.procs:
        raise ValueError("--procs is larger than --publishers: some processes would idle")
    return {"messages": args.messages, "size": _size(args), "window": args.window,
            "publishers": args.publishers, "verify": args.verify}


async def _publish_prepare(params: Params) -> Params:
    return {**params, "topic": params["topic"] or unique_topic("bench-publish")}


async def _publish_work(params: Params, share: Share) -> WorkerResult:
    counts = publisher_counts(params["messages"], params["publishers"])
    mine = share.mine(params["publishers"])
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    results: list[Published] = []
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
            figg_client(params["figg"], window=params["window"])) for _ in mine]
        await share.start()

        async def one(client: FiggClient, publisher: int) -> None:
            results.append(await publish_stamped(client, params["topic"], payloads,
                                                 params["run"], publisher, counts[publisher]))

        async with trio.open_nursery() as nursery:
            for client, publisher in zip(clients, mine, strict=True):
                nursery.start_soon(one, client, publisher)
        return share.finish(
            {"sent": sum(r.sent for r in results), "acked": sum(r.acked for r in results),
             "reconnects": sum(r.reconnects for r in results)},
            {"ack": [s for r in results for s in r.latencies]},
            publisher_rates=[r.acked / r.seconds for r in results if r.seconds > 0])


async def read_back(params: Params, expected: dict[int, int], stall: float = 10.0
                    ) -> Tally:
    """Read the topic from offset 0 over Figg and tally this run's messages."""
    tally = Tally(params["run"], expected)
    async with figg_client(params["figg"]) as client:
        sub = await client.subscribe(params["topic"], from_offset=0,
                                     buffer=SUBSCRIPTION_BUFFER)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_stalled, nursery.cancel_scope,
                               lambda: tally.received + tally.duplicates + tally.foreign,
                               stall)
            async for message in sub:
                tally.add(message.data)
                if tally.complete:
                    break
            nursery.cancel_scope.cancel()
    return tally


def _publish_row(results: list[WorkerResult], size: int, own_time: bool = False) -> Row:
    """The publishers' row; ``own_time``: over the publishers' time, not the run's."""
    acked = total(results, "acked")
    rates = [rate for r in results for rate in r.info.get("publisher_rates", ())]
    seconds = wall(results)
    if own_time:
        seconds = max((t for r in results for t in r.info.get("publisher_seconds", ())),
                      default=seconds)
    return Row("publish", acked, seconds, acked * size,
               summarize(samples(results, "ack")), "ack",
               per_client=sum(rates) / len(rates) if len(rates) > 1 else None)


def _reconnect_problem(results: list[WorkerResult]) -> str:
    reconnects = total(results, "reconnects")
    return (f"{reconnects} reconnect(s): unacknowledged publishes were resent"
            if reconnects else "")


async def _publish_finish(params: Params, results: list[WorkerResult]) -> Report:
    checks = [Check("acknowledged", params["messages"], total(results, "acked"),
                    problem=_reconnect_problem(results))]
    if params["verify"]:
        tally = await read_back(params, publisher_counts(params["messages"],
                                                         params["publishers"]))
        checks.append(Check("read back from offset 0", tally.total_expected, tally.received,
                            tally.duplicates))
    return make_report("figg-publish", params, results,
                       [_publish_row(results, params["size"])], checks)


# --------------------------------------------------------------------- figg-subscribe


def _add_subscribe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=100_000,
                        help="messages published during the run, in all")
    parser.add_argument("--backlog", type=int, default=100_000,
                        help="messages on the topic before the run, which resuming "
                             "subscribers read first")
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--window", type=int, default=256,
                        help="unacknowledged publishes per publisher")
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--live", type=int, default=2,
                        help="subscribers attached at the end before publishing starts")
    parser.add_argument("--resuming", type=int, default=2,
                        help="subscribers that attach from offset 0 when publishing starts")
    parser.add_argument("--stall", type=float, default=10.0,
                        help="seconds without a message after which a run gives up")


def _subscribe_params(args: argparse.Namespace) -> Params:
    if args.live < 0 or args.resuming < 0 or args.backlog < 0:
        raise ValueError("--live, --resuming and --backlog can not be negative")
    return {"messages": args.messages, "backlog": args.backlog, "size": _size(args),
            "window": args.window, "publishers": args.publishers, "live": args.live,
            "resuming": args.resuming, "stall": args.stall}


async def _subscribe_prepare(params: Params) -> Params:
    topic = params["topic"] or unique_topic("bench-subscribe")
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    async with figg_client(params["figg"], window=params["window"]) as client:
        await publish_stamped(client, topic, payloads, params["run"],
                              params["publishers"], params["backlog"])
    return {**params, "topic": topic}


@dataclass
class _Reader:
    """One subscriber of the run."""

    kind: str
    tally: Tally
    last: float = 0.0
    latencies: list[float] = field(default_factory=list)


async def _drain(client: FiggClient, reader: _Reader, topic: str, from_offset: int | None,
                 since_ns: int, sub: Subscription | None = None) -> None:
    """Read until every expected message arrived; sample the latency of those published
    since ``since_ns`` (the backlog's stamps are older than the run)."""
    if sub is None:
        sub = await client.subscribe(topic, from_offset=from_offset, wait=False,
                                     buffer=SUBSCRIPTION_BUFFER)
    tally, latencies = reader.tally, reader.latencies
    every = stride(tally.total_expected, SAMPLE_CAP)
    clock = time.monotonic_ns
    async for message in sub:
        stamp = tally.add(message.data)
        if tally.received % every == 0 and stamp >= since_ns:
            latencies.append((clock() - stamp) / 1e9)
        if tally.complete:
            break
    reader.last = time.monotonic()


async def _subscribe_work(params: Params, share: Share) -> WorkerResult:
    counts = publisher_counts(params["messages"], params["publishers"])
    live_expected = dict(counts)
    resume_expected = {**counts, params["publishers"]: params["backlog"]}
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    topic, run = params["topic"], params["run"]
    pubs = share.mine(params["publishers"])
    readers = ([_Reader("live", Tally(run, live_expected)) for _ in share.mine(params["live"])]
               + [_Reader("resuming", Tally(run, resume_expected))
                  for _ in share.mine(params["resuming"])])
    published = [Published() for _ in pubs]
    async with AsyncExitStack() as stack:
        async def connect(**options: Unpack[FiggOptions]) -> FiggClient:
            return await stack.enter_async_context(figg_client(params["figg"], **options))

        reader_clients = [await connect(subscription_buffer=SUBSCRIPTION_BUFFER)
                          for _ in readers]
        live_subs = {id(r): await c.subscribe(topic, buffer=SUBSCRIPTION_BUFFER)
                     for r, c in zip(readers, reader_clients, strict=True)
                     if r.kind == "live"}
        pub_clients = [await connect(window=params["window"]) for _ in pubs]
        await share.start()
        since_ns = time.monotonic_ns()

        def progress() -> int:
            return (sum(r.tally.received + r.tally.duplicates for r in readers)
                    + sum(p.sent for p in published))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_stalled, nursery.cancel_scope, progress,
                               params["stall"])
            async with trio.open_nursery() as load:
                for client, publisher, out in zip(pub_clients, pubs, published, strict=True):
                    load.start_soon(publish_stamped, client, topic, payloads, run, publisher,
                                    counts[publisher], out)
                for reader, client in zip(readers, reader_clients, strict=True):
                    load.start_soon(_drain, client, reader, topic,
                                    None if reader.kind == "live" else 0, since_ns,
                                    live_subs.get(id(reader)))
            nursery.cancel_scope.cancel()
    result_counts = {"acked": sum(p.acked for p in published),
                     "reconnects": sum(p.reconnects for p in published)}
    kinds: dict[str, list[float]] = {"ack": [s for p in published for s in p.latencies]}
    info: dict[str, Any] = {
        "publisher_rates": [p.acked / p.seconds for p in published if p.seconds],
        "publisher_seconds": [p.seconds for p in published]}
    for kind in ("live", "resuming"):
        mine = [r for r in readers if r.kind == kind]
        for key in ("expected", "received", "duplicates"):
            result_counts[f"{kind}_{key}"] = sum(r.tally.summary()[key] for r in mine)
        kinds[kind] = [s for r in mine for s in r.latencies]
        info[f"{kind}_last"] = [r.last for r in mine if r.last]
        info[f"{kind}_received"] = [r.tally.received for r in mine]
    return share.finish(result_counts, kinds, **info)


def _kind_row(kind: str, how_many: int, results: list[WorkerResult], size: int) -> Row:
    start = min(r.start for r in results)
    lasts = [t for r in results for t in r.info.get(f"{kind}_last", ())]
    received = [n for r in results for n in r.info.get(f"{kind}_received", ())]
    seconds = (max(lasts) - start) if lasts else wall(results)
    per_client = None
    if lasts and len(received) == len(lasts):
        per_client = sum(n / max(t - start, 1e-9)
                         for n, t in zip(received, lasts, strict=True)) / len(lasts)
    delivered = total(results, f"{kind}_received")
    return Row(f"{kind} subscribers ({how_many})", delivered, seconds, delivered * size,
               summarize(samples(results, kind)), "publish->deliver",
               per_client=per_client)


async def _subscribe_finish(params: Params, results: list[WorkerResult]) -> Report:
    rows = [_publish_row(results, params["size"], own_time=True)]
    checks = [Check("acknowledged", params["messages"], total(results, "acked"),
                    problem=_reconnect_problem(results))]
    for kind in ("live", "resuming"):
        if params[kind]:
            rows.append(_kind_row(kind, params[kind], results, params["size"]))
            checks.append(Check(f"{kind} subscribers", total(results, f"{kind}_expected"),
                                total(results, f"{kind}_received"),
                                total(results, f"{kind}_duplicates")))
    notes = ["subscriber rows: messages delivered to all subscribers of the kind, from the "
             "start to the last delivery; latency from publish() to delivery (sampled, "
             "messages published during the run only)"]
    return make_report("figg-subscribe", params, results, rows, checks, notes)


SCENARIOS = (
    Scenario("figg-publish", "Figg: P publishers send N messages of S bytes with a window "
             "of W unacknowledged publishes", _add_publish_arguments, _publish_params,
             _publish_work, _publish_finish, _publish_prepare, frozenset({"figg"})),
    Scenario("figg-subscribe", "Figg: P publishers, C live and R resuming (offset 0) "
             "subscribers on one topic", _add_subscribe_arguments, _subscribe_params,
             _subscribe_work, _subscribe_finish, _subscribe_prepare, frozenset({"figg"})),
)
