"""``python -m gateway.bench.soak``: the options and the run.

The run: fill a topic for the Consumes, start the well-behaved client and let it settle
in, then run every abuser at once for ``--seconds`` while sampling the server, stop the
abusers (closing every connection they hold), let the well-behaved client drain and
read its topics back, wait out ``--settle``, sample once more and ask ``/health``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

from gateway.bench.soak.abusers import ABUSERS, run_abuser
from gateway.bench.soak.plan import Caps, Context, MiB, Tally
from gateway.bench.soak.report import acknowledged_lost, text, verdict
from gateway.bench.soak.tank_abusers import fill_topic
from gateway.bench.soak.target import Sample, Sampler, Target, attached, own_server
from gateway.bench.soak.wire import close, connect, http_get, http_request
from gateway.client.errors import ClientError
from gateway.core.logs import configure_logging


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.bench.soak",
        description="Abuse a figtank on loopback for a fixed time while a well-behaved "
                    "client measures its latency; report peak RSS and descriptors, the "
                    "client's p99 and the acknowledged messages lost (exit 1 unless 0, "
                    "or when the server died).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the abuse lasts")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after the abuse before the final sample")
    parser.add_argument("--recovery", type=float, default=120.0,
                        help="seconds the server gets after the abuse to answer /health "
                             "again before the well-behaved client stops and reads back")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--only", default="", help="comma-separated abusers to run, or none for a "
                        f"baseline (default all: {', '.join(ABUSERS)})")
    parser.add_argument("--skip", default="", help="comma-separated abusers not to run")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every abuser's counts (0.1: a light run)")
    parser.add_argument("--max-server-rss", type=int, default=8192, metavar="MIB",
                        help="end the abuse early when the server's RSS passes this")
    own = parser.add_argument_group("the server the soak starts (default)")
    own.add_argument("--durability", default="fsync", choices=("fsync", "os"))
    own.add_argument("--config", default=None, help="a figtank.toml for it")
    own.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                     help="one more argument for 'figtank serve' (repeatable)")
    running = parser.add_argument_group(
        "a running server instead (all four, loopback only)")
    running.add_argument("--pid", type=int, default=None)
    running.add_argument("--figg", default=None, metavar="HOST:PORT")
    running.add_argument("--tank", default=None, metavar="HOST:PORT")
    running.add_argument("--metrics", default=None, metavar="HOST:PORT")
    good = parser.add_argument_group("the well-behaved client")
    good.add_argument("--rate", type=float, default=200.0, help="Figg publishes per second")
    good.add_argument("--tank-rate", type=float, default=50.0, help="Tank produces per second")
    good.add_argument("--drain", type=float, default=15.0,
                      help="seconds it waits for its last ACKs (reading back: 3 times this)")
    good.add_argument("--warm-up", type=float, default=2.0,
                      help="seconds it runs alone before the abuse starts")
    caps = parser.add_argument_group("the abusers' footprint")
    for field in Caps.fields():
        caps.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default),
                          default=field.default, help=field.metadata["help"])
    args = parser.parse_args(list(argv) if argv is not None else None)
    attach = [args.pid, args.figg, args.tank, args.metrics]
    if any(a is not None for a in attach) and not all(a is not None for a in attach):
        parser.error("a running server needs --pid, --figg, --tank and --metrics")
    if args.seconds <= 0 or min(args.settle, args.recovery, args.drain, args.warm_up) < 0:
        parser.error("--seconds must be positive, --settle, --recovery, --drain and "
                     "--warm-up not negative")
    args.abusers = _selected(parser, args.only, args.skip)
    if args.pid is not None:
        try:
            args.target = attached(args.pid, args.figg, args.tank, args.metrics)
        except ValueError as exc:
            parser.error(str(exc))
    return args


def _selected(parser: argparse.ArgumentParser, only: str, skip: str) -> list[str]:
    if only == "none":
        return []  # the well-behaved client alone: a baseline
    names = [n for n in only.split(",") if n] or list(ABUSERS)
    skipped = [n for n in skip.split(",") if n]
    unknown = sorted(set(names + skipped) - set(ABUSERS))
    if unknown:
        parser.error(f"unknown abusers: {', '.join(unknown)} (known: {', '.join(ABUSERS)})")
    return [n for n in names if n not in skipped]


def caps_from(args: argparse.Namespace) -> Caps:
    caps = Caps(**{f.name: getattr(args, f.name) for f in Caps.fields()})
    return caps.scaled(args.scale) if args.scale != 1.0 else caps


class GoodClient:
    """The well-behaved client's process (:mod:`gateway.bench.soak.good`)."""

    def __init__(self, target: Target, args: argparse.Namespace) -> None:
        figg, tank = (f"{h}:{p}" for h, p in (target.figg, target.tank))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.bench.soak.good", "--figg", figg, "--tank", tank,
             "--rate", str(args.rate), "--tank-rate", str(args.tank_rate),
             "--drain-timeout", str(args.drain), "--max-seconds", str(args.seconds + 600)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    async def ready(self) -> dict[str, Any]:
        with trio.fail_after(60):
            return await self._line()

    async def finish(self) -> dict[str, Any]:
        """Tell it to stop; its figures (``{"error": ...}`` when it failed)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        except OSError:
            pass
        with trio.move_on_after(180):
            return await self._line()
        return {"error": "the well-behaved client did not report within 180 s"}

    async def _line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = await trio.to_thread.run_sync(self.process.stdout.readline,
                                                 abandon_on_cancel=True)
            if not line:
                return {"error": f"the well-behaved client exited ({self.process.poll()})"}
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


async def limit_hits(target: Target) -> dict[str, float]:
    """``figtank_limit_hits`` by limit, from ``/metrics`` (empty when there is none)."""
    hits: dict[str, float] = {}
    with trio.move_on_after(30):
        try:
            body = await _fetch_text(target, "/metrics")
        except (OSError, trio.BrokenResourceError):
            return hits
        for line in body.splitlines():
            if line.startswith("figtank_limit_hits{"):
                labels, _, value = line.rpartition(" ")
                hits[labels.split('limit="', 1)[-1].split('"', 1)[0]] = float(value)
    return hits


async def _fetch_text(target: Target, path: str) -> str:
    stream = await connect(target.metrics)
    chunks = []
    try:
        await stream.send_all(http_request(path))
        while data := await stream.receive_some(1 << 16):
            chunks.append(data)
    finally:
        await close(stream)
    return b"".join(chunks).decode("utf-8", "replace")


async def wait_healthy(target: Target, patience: float) -> float | None:
    """Seconds until ``/health`` answers 200 (asked every second, 5 s allowed for each
    answer); None when it did not within ``patience`` seconds."""
    start = time.monotonic()
    while True:
        answer = await http_get(target.metrics, "/health", timeout=5.0)
        elapsed = time.monotonic() - start
        if answer.status == 200:
            return round(elapsed, 2)
        if elapsed >= patience or not target.alive():
            return None
        await trio.sleep(1.0)


async def soak(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """The whole run against ``target``; the report's dict."""
    caps = caps_from(args)
    run = secrets.token_hex(3)
    ctx = Context(target, caps, run, f"soak-data-{run}")
    with trio.fail_after(120):
        await fill_topic(ctx)
    sampler = Sampler(target.pid)
    start = sampler.take()
    good = GoodClient(target, args)
    try:
        return await _abuse(ctx, args, sampler, start, good)
    finally:
        good.stop()


async def _abuse(ctx: Context, args: argparse.Namespace, sampler: Sampler, start: Sample,
                 good: GoodClient) -> dict[str, Any]:
    ready = await good.ready()
    if "error" in ready:
        raise RuntimeError(f"the well-behaved client did not start: {ready['error']}")
    await trio.sleep(args.warm_up)
    tallies = {name: Tally(name) for name in args.abusers}
    limit = args.max_server_rss * MiB
    abuse = trio.CancelScope()
    guard: list[str] = []
    began = time.monotonic()

    def on_rss(rss: int) -> None:
        if rss > limit and not guard:
            guard.append(f"ended the abuse after {time.monotonic() - began:.1f} s: server "
                         f"RSS {rss / MiB:,.0f} MiB over --max-server-rss {args.max_server_rss}")
            abuse.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler.run, on_rss)
        with abuse:
            abuse.deadline = trio.current_time() + args.seconds
            async with trio.open_nursery() as abusers:
                abusers.start_soon(trio.sleep_forever)  # the time is fixed, abusers or not
                for name, tally in tallies.items():
                    abusers.start_soon(run_abuser, name, ctx, tally)
        abuse_seconds = time.monotonic() - began
        recovery = await wait_healthy(ctx.target, args.recovery)
        if ctx.target.alive():
            figures = await good.finish()
        else:  # nothing to read back from
            figures = {"error": "the server died"}
        await trio.sleep(max(0.0, began + abuse_seconds + args.settle - time.monotonic()))
        final = sampler.take()
        nursery.cancel_scope.cancel()
    health = await http_get(ctx.target.metrics, "/health", timeout=10)
    alive = ctx.target.alive()
    hits = await limit_hits(ctx.target) if alive else {}
    result = {
        "seconds": args.seconds, "abuse_seconds": round(abuse_seconds, 2),
        "settle_seconds": args.settle,
        "server": {**_server(ctx.target, alive, health.status),
                   "health_after_abuse_seconds": recovery},
        "rss_bytes": {"start": start.rss, "peak": sampler.peak_rss, "final": final.rss},
        "descriptors": {"start": start.fds, "peak": sampler.peak_fds, "final": final.fds},
        "samples": sampler.samples, "memory_guard": guard[0] if guard else None,
        "well_behaved": figures, "acknowledged_lost": acknowledged_lost(figures),
        "abusers": {name: dataclasses.asdict(t) for name, t in tallies.items()},
        "caps": dataclasses.asdict(ctx.caps), "limit_hits": hits,
    }
    result["ok"] = verdict(result)
    return result


def _server(target: Target, alive: bool, health: int) -> dict[str, Any]:
    info: dict[str, Any] = {"pid": target.pid, "own": target.process is not None,
                            "alive": alive, "health": health,
                            "survived": alive and health == 200, **target.settings}
    if target.process is not None and not alive:
        info["exit_code"] = target.process.returncode
    if target.log is not None:
        info["log"] = target.log.summary()
    return info


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start (or attach to) the server and soak it."""
    if args.pid is not None:
        return trio.run(soak, args.target, args)
    serve_args = [*(["--config", args.config] if args.config else []), *args.serve_arg]
    with own_server(serve_args, args.durability) as target:
        result = trio.run(soak, target, args)
    result["server"]["shutdown"] = target.shutdown
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    configure_logging("error")  # on stderr: stdout carries the report
    try:
        result = run(args)
    except (ClientError, ValueError, RuntimeError, TimeoutError, OSError,
            trio.TooSlowError) as exc:
        print(f"soak: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1) if args.json else text(result), flush=True)
    return 0 if result["ok"] else 1
