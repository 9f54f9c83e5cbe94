"""figtank beside a peer broker, measured by the peer's OWN benchmark clients.

Run: ``python -m gateway.bench.peers --figg-bench PATH --tank-cli PATH
--peer-figg HOST:PORT --peer-tank HOST:PORT (--figtank-figg HOST:PORT --figtank-tank
HOST:PORT | --start-figtank fsync,os) [--rounds 3] [--scale 1] [--json]``
(``make bench-peers`` runs it with ``--start-figtank fsync,os``).

Every server must already be running on this machine (loopback), except figtank with
``--start-figtank MODES`` (started here on free loopback ports with a temporary store, once
per durability mode named: ``fsync``, ``os`` or both). With both, the Figg measures run
once against each (the peer alternating with each in turn) and the Tank measures against
``os`` (a Tank broker acknowledges from the page cache).
Each measure runs only when its client binary and both its endpoints are given, against
the peer and against figtank in turn (the side that goes first swaps every round),
``--rounds`` times; the tables show each side's median and the ratio. Every client run is
time-bound (``--timeout``) and uses topics of its own.

Figg, with ``figg-bench``: ``--msgs 200000 --msg-size 128``, once with one publisher and
one subscriber and once with ``--pubs 4 --subs 4``; its "pub stats", "sub stats" and
"resume stats" lines.

Tank, with ``tank-cli``: ``create_topic`` then ``bm p2b -s 100 -c 500000 -B 1000`` (its
"Got ACK after publishing ..., took T" line); then ``figtank bench tank-produce`` fills a
topic with 100,000 x 1 KiB messages in bundles of 100, one request in flight (the
seconds it reports), and ``tank-cli consume -F ignore -S -d 0`` reads that topic back,
timed by the wall clock around the process and by its own "consumed in" figure.

``--gateway`` (with ``--start-figtank MODE``, ``make bench-gateway``): the same clients
straight at a started figtank and through a gateway in front of its Kafka listener
(``figtank serve --upstream-kafka``), the gateway in the figtank columns.

This script builds and downloads nothing: it runs the client binaries it is given.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import json
import os
import re
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.bench.procs import process_cpu_seconds
from gateway.bench.report import describe_machine, figtank_version, machine_info
from gateway.bench.serving import Served, serve_figtank

FIGG_MSGS = 200_000
FIGG_MSG_SIZE = 128
P2B_MSGS = 500_000
P2B_SIZE = 100
P2B_BUNDLE = 1_000
KIB_MSGS = 100_000
KIB_BUNDLE = 100
KIB_SIZE = 1024
MB = 1_000_000

# ----------------------------------------------------------------- parsing the clients

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FIGG_STATS = re.compile(r"^\s*(pub|sub|resume) stats:\s*([\d,]+(?:\.\d+)?)\s*msgs/sec",
                         re.MULTILINE)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(us|µs|ms|h|m|s)")
_P2B = re.compile(r"Got ACK after publishing ([\d,]+) message\(s\).*?took (\S+)")
_CONSUMED_BATCH = re.compile(r"^>> ([\d,]+) messages", re.MULTILINE)
_CONSUMED_IN = re.compile(r"messages consumed in (\S+?),")
_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (tank-cli prints bold topic names)."""
    return _ANSI.sub("", text)


def number(text: str) -> float:
    """A figure with comma thousands separators: ``"351,513"`` -> 351513.0."""
    return float(text.replace(",", ""))


def parse_figg_bench(output: str) -> dict[str, float]:
    """figg-bench's ``  pub stats: 351,513 msgs/sec ~ 42.91 MB/sec`` lines (and sub,
    resume) as ``{"pub": 351513.0, ...}``; with ``--runs`` above 1, the last run's."""
    return {kind: number(figure) for kind, figure in _FIGG_STATS.findall(strip_ansi(output))}


def parse_duration(text: str) -> float:
    """tank-cli's durations in seconds: ``"850us"``, ``"12ms"``, ``"0.156s"``, ``"1m5s"``,
    ``"2m"``, ``"1h3m"``."""
    text = text.strip().rstrip(",")
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(value + unit for value, unit in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(value) * _SECONDS[unit] for value, unit in parts)


def parse_p2b(output: str) -> tuple[int, float]:
    """``(messages, seconds)`` from tank-cli bm p2b's ``Got ACK after publishing 500,000
    message(s) of size 100b (47.68mb), took 0.156s``."""
    found = _P2B.search(strip_ansi(output))
    if found is None:
        raise ValueError("no \"Got ACK after publishing\" line")
    return int(number(found.group(1))), parse_duration(found.group(2))


def parse_consume(output: str) -> tuple[int, float | None]:
    """``(messages, seconds)`` from ``tank-cli consume -S``: the messages summed over its
    per-response ``>> N messages`` lines (its final total counts each message twice) and
    the seconds of its ``... consumed in 0.069s, ...`` line (None when missing)."""
    text = strip_ansi(output)
    messages = sum(int(number(n)) for n in _CONSUMED_BATCH.findall(text))
    found = _CONSUMED_IN.search(text)
    return messages, parse_duration(found.group(1)) if found else None


# ----------------------------------------------------------------- figures and tables


@dataclass
class Measure:
    """One line of a table: a figure taken from both sides, round after round."""

    group: str
    label: str
    #: "msgs/s" (higher is better) or "s" (lower is better).
    unit: str
    values: dict[str, list[float]] = field(default_factory=lambda: {"peer": [],
                                                                     "figtank": []})
    failures: dict[str, list[str]] = field(default_factory=lambda: {"peer": [],
                                                                       "figtank": []})
    #: Per side, per round: CPU microseconds per message of each process measured
    #: (:class:`CpuMeter`): the client, and the servers started here.
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"peer": [],
                                                                             "figtank": []})

    def median(self, side: str) -> float | None:
        values = self.values[side]
        return statistics.median(values) if values else None

    def ratio(self) -> float | None:
        """figtank over the peer as throughput: above 1, figtank is faster."""
        return ratio(self.median("figtank"), self.median("peer"), self.unit)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "label": self.label, "unit": self.unit,
                **{side: {"values": self.values[side], "median": self.median(side),
                          "failures": self.failures[side], "cpu_us_per_msg": self.cpu[side]}
                   for side in ("peer", "figtank")},
                "ratio": self.ratio()}

    def cpu_median(self, side: str) -> dict[str, float]:
        """Each process's median CPU microseconds per message over the rounds of ``side``."""
        rounds = self.cpu[side]
        names = dict.fromkeys(name for r in rounds for name in r)
        return {name: statistics.median(r.get(name, 0.0) for r in rounds) for name in names}


def ratio(figtank: float | None, peer: float | None, unit: str) -> float | None:
    """figtank / peer for a rate, peer / figtank for a time (so above 1 always means
    figtank is faster); None without both figures."""
    if not figtank or not peer:
        return None
    return figtank / peer if unit == "msgs/s" else peer / figtank


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if unit == "msgs/s":
        return f"{value:,.0f} msgs/s"
    return f"{value:.3f} s" if value < 10 else f"{value:,.1f} s"


def cell(measure: Measure, side: str) -> str:
    """A side's median, with the rounds that failed; "failed" when none gave a figure."""
    text = format_value(measure.median(side), measure.unit)
    failed = len(measure.failures[side])
    if failed:
        runs = failed + len(measure.values[side])
        text = f"{text} (failed {failed}/{runs})" if text else f"failed {failed}/{runs}"
    return text


def markdown_table(measures: Sequence[Measure], peer: str) -> str:
    """``| measure (same client, same run) | PEER | figtank | ratio |``."""
    lines = [f"| measure (same client, same run) | {peer} | figtank | ratio |",
             "|---|--:|--:|--:|"]
    for m in measures:
        r = m.ratio()
        lines.append(f"| {m.label} | {cell(m, 'peer')} | {cell(m, 'figtank')} "
                     f"| {'' if r is None else f'{r:.2f}'} |")
    return "\n".join(lines)


def cpu_bound(cpu: dict[str, float], cores: int) -> float | None:
    """The highest rate (msgs/s) the CPU these processes spend per message allows on
    ``cores`` cores: all of them sharing the cores, and none faster than one core."""
    total = sum(cpu.values())
    if total <= 0:
        return None
    return min(cores * 1e6 / total, 1e6 / max(cpu.values()))


def cpu_table(measures: Sequence[Measure], sides: dict[str, str], cores: int) -> str:
    """Each measured run's CPU per message by process (medians), and the rate that CPU
    allows on this machine (:func:`cpu_bound`) against the rate measured."""
    names = list(dict.fromkeys(name for m in measures for side in sides
                               for name in m.cpu_median(side)))
    lines = [f"| measure | side | {' | '.join(f'{n} µs/msg' for n in names)} | all µs/msg "
             f"| CPU allows ({cores} cores) | measured | measured / allowed |",
             "|---|---|" + "--:|" * (len(names) + 4)]
    for m in measures:
        for side, label in sides.items():
            cpu = m.cpu_median(side)
            if not cpu:
                continue
            bound = cpu_bound(cpu, cores)
            rate = m.median(side)
            lines.append(
                f"| {m.label} | {label} | "
                + " | ".join(f"{cpu.get(n, 0.0):.2f}" for n in names)
                + f" | {sum(cpu.values()):.2f} | {format_value(bound, m.unit)} "
                f"| {format_value(rate, m.unit)} | "
                + (f"{rate / bound:.2f}" if bound and rate else "") + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------- running the clients


class RunFailed(Exception):
    """A client run that gave no figure; the message says why."""


def run_client(command: Sequence[str], timeout: float) -> tuple[str, float]:
    """Run ``command`` to its end: ``(stdout and stderr, wall seconds)``; RunFailed when it
    times out (it is killed) or exits non-zero."""
    started = time.perf_counter()
    try:
        done = subprocess.run(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{Path(command[0]).name} timed out after {timeout:.0f} s") from None
    except OSError as exc:
        raise RunFailed(f"{command[0]}: {exc}") from None
    wall = time.perf_counter() - started
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        last = strip_ansi(output).strip().splitlines()[-1:] or ["no output"]
        raise RunFailed(f"{Path(command[0]).name} exited with {done.returncode}: {last[0]}")
    return output, wall


def unique_topic(prefix: str) -> str:
    """A fresh topic name (Tank's rules: letters, digits, '-', '_')."""
    return f"{prefix}-{secrets.token_hex(4)}"


def sides_in_order(round_: int) -> tuple[str, str]:
    """Who goes first swaps every round: peer first in round 1."""
    return ("peer", "figtank") if round_ % 2 else ("figtank", "peer")


def _add(measure: Measure, side: str, round_: int, got: float | str) -> None:
    """A round's figure, or why it has none."""
    if isinstance(got, str):
        measure.failures[side].append(f"round {round_}: {got}")
        print(f"   {side}, round {round_}: {measure.label}: {got}", file=sys.stderr,
              flush=True)
    else:
        measure.values[side].append(got)


@dataclass
class Setup:
    """What the measures run with."""

    rounds: int
    scale: float
    timeout: float
    figg_bench: str | None
    tank_cli: str | None
    figg: dict[str, str | None]   # side -> Figg endpoint
    tank: dict[str, str | None]   # side -> Tank endpoint
    #: Servers started here whose CPU is measured around each run: name -> pid.
    servers: dict[str, int] = field(default_factory=dict)


def scaled(count: int, scale: float, least: int = 1) -> int:
    return max(least, round(count * scale))


class CpuMeter:
    """CPU used around a client run: the client's (this process's children reaped
    meanwhile) and each server's started here (``/proc/PID/stat``), as microseconds per
    message."""

    def __init__(self, servers: dict[str, int]) -> None:
        self._servers = servers
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        now = {"client": usage.ru_utime + usage.ru_stime}
        for name, pid in self._servers.items():
            now[name] = process_cpu_seconds(pid) or 0.0
        return now

    def start(self) -> None:
        self._start = self._now()

    def per_message(self, messages: int) -> dict[str, float]:
        """Microseconds of CPU per message since :meth:`start`, by process."""
        now = self._now()
        return {name: (now[name] - self._start[name]) * 1e6 / max(messages, 1)
                for name in now}


def figg_measures(setup: Setup, mode: str | None = None) -> list[Measure]:
    """figg-bench against both sides: pub/sub/resume msgs/s, two shapes; ``mode``: the
    durability figtank was started with, named in the labels."""
    msgs = scaled(FIGG_MSGS, setup.scale)
    out: list[Measure] = []
    suffix = f", figtank `{mode}`" if mode else ""
    for shape, extra in (("1 pub, 1 sub", []), ("4 pubs, 4 subs",
                                                 ["--pubs", "4", "--subs", "4"])):
        stats = {kind: Measure("figg", f"figg-bench {msgs:,} x {FIGG_MSG_SIZE} B, {shape}: "
                               f"{kind} stats{suffix}", "msgs/s")
                 for kind in ("pub", "sub", "resume")}
        out += stats.values()
        for round_ in range(1, setup.rounds + 1):
            for side in sides_in_order(round_):
                print(f"== figg-bench {shape} ({side}, round {round_})", file=sys.stderr,
                      flush=True)
                meter = CpuMeter(setup.servers)
                meter.start()
                try:
                    found = run_figg_bench(setup.figg_bench or "", setup.figg[side] or "",
                                           msgs, FIGG_MSG_SIZE, setup.timeout, *extra)
                except RunFailed as exc:
                    found, error = {}, str(exc)
                else:
                    error = "no such line in its output"
                    if setup.servers and not extra:  # one publisher: CPU per message
                        stats["pub"].cpu[side].append(meter.per_message(msgs))
                for kind, measure in stats.items():
                    _add(measure, side, round_, found.get(kind, error))
    return out


def _figtank_produce(endpoint: str, topic: str, messages: int, timeout: float) -> float:
    """``figtank bench tank-produce`` of 1 KiB messages, one request at a time: seconds."""
    command = [sys.executable, "-m", "gateway.cli", "bench", "tank-produce", "--tank",
               endpoint, "--topic", topic, "--messages", str(messages), "--size",
               str(KIB_SIZE), "--bundle", str(KIB_BUNDLE), "--in-flight", "1",
               "--compression", "none", "--timeout", str(timeout), "--json"]
    output, _ = run_client(command, timeout + 30)
    try:
        report = json.loads(output.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise RunFailed("figtank bench printed no report") from None
    if not report["ok"]:
        raise RunFailed("figtank bench: messages were lost or duplicated")
    return float(report["rows"][0]["seconds"])


def run_p2b(cli: str, endpoint: str, count: int, bundle: int, timeout: float) -> float:
    """tank-cli's ``create_topic`` then ``bm p2b -s 100 -c count -B bundle`` on a topic of
    its own: messages/s (RunFailed, ValueError when it fails or acknowledges fewer)."""
    topic = unique_topic("cmp-p2b")
    run_client([cli, "-b", endpoint, "-t", topic, "create_topic", "1"], timeout)
    output, _ = run_client([cli, "-b", endpoint, "-t", topic, "bm", "p2b", "-s",
                            str(P2B_SIZE), "-c", str(count), "-B", str(bundle)], timeout)
    messages, seconds = parse_p2b(output)
    if messages != count:
        raise RunFailed(f"acknowledged {messages:,} of {count:,} messages")
    return messages / max(seconds, 1e-6)


def run_figg_bench(path: str, address: str, messages: int, size: int, timeout: float,
                   *extra: str) -> dict[str, float]:
    """figg-bench on a topic of its own: its stats lines (:func:`parse_figg_bench`)."""
    command = [path, "--addr", address, "--msgs", str(messages), "--msg-size", str(size),
               "--topic", unique_topic("cmp-figg"), *extra]
    return parse_figg_bench(run_client(command, timeout)[0])


def tank_round(cli: str, endpoint: str, p2b: tuple[int, int], kib_msgs: int,
               timeout: float, meter: CpuMeter | None = None
               ) -> tuple[dict[str, float | str], dict[str, float] | None]:
    """One round of the Tank measures on one side: a figure, or why there is none, for
    "p2b" (msgs/s), "produce", "consume_wall" and "consume_own" (seconds); and with
    ``meter``, the CPU per message of the p2b run (its topic's creation included)."""
    out: dict[str, float | str] = {}
    cpu = None
    if meter is not None:
        meter.start()
    try:
        out["p2b"] = run_p2b(cli, endpoint, *p2b, timeout)
    except (RunFailed, ValueError) as exc:
        out["p2b"] = str(exc)
    else:
        cpu = None if meter is None else meter.per_message(p2b[0])
    topic = unique_topic("cmp-kib")
    try:
        out["produce"] = _figtank_produce(endpoint, topic, kib_msgs, timeout)
    except RunFailed as exc:
        out["produce"] = str(exc)
        out["consume_wall"] = out["consume_own"] = "nothing to consume: the produce failed"
        return out, cpu
    try:
        output, seconds = run_client([cli, "-b", endpoint, "-t", topic, "consume", "-F",
                                      "ignore", "-S", "-d", "0"], timeout)
        messages, own = parse_consume(output)
        if messages != kib_msgs:
            raise RunFailed(f"consumed {messages:,} of {kib_msgs:,} messages")
    except (RunFailed, ValueError) as exc:
        out["consume_wall"] = out["consume_own"] = str(exc)
    else:
        out["consume_wall"] = seconds
        out["consume_own"] = "no \"consumed in\" line" if own is None else own
    return out, cpu


def tank_measures(setup: Setup, mode: str | None = None) -> list[Measure]:
    """tank-cli (and figtank bench's request-by-request produce) against both sides;
    ``mode``: the durability figtank was started with, named in the labels."""
    p2b_msgs = scaled(P2B_MSGS, setup.scale)
    p2b_bundle = min(P2B_BUNDLE, p2b_msgs)
    kib_msgs = scaled(KIB_MSGS, setup.scale, KIB_BUNDLE)
    suffix = f", figtank `{mode}`" if mode else ""
    measures = {
        "p2b": Measure("tank", f"tank-cli bm p2b: {p2b_msgs:,} x {P2B_SIZE} B in bundles of "
                       f"{p2b_bundle:,}, one request{suffix}", "msgs/s"),
        "produce": Measure("tank", f"produce {KIB_BUNDLE} x 1 KiB bundles, "
                           f"{kib_msgs * KIB_SIZE / MB:,.0f} MB, request by request "
                           f"(figtank bench tank-produce --in-flight 1){suffix}", "s"),
        "consume_wall": Measure("tank", "tank-cli consume of that topic, wall clock around "
                                f"the process{suffix}", "s"),
        "consume_own": Measure("tank", "tank-cli consume of that topic, its \"consumed "
                               f"in\"{suffix}", "s"),
    }
    for round_ in range(1, setup.rounds + 1):
        for side in sides_in_order(round_):
            print(f"== tank ({side}, round {round_})", file=sys.stderr, flush=True)
            got, cpu = tank_round(setup.tank_cli or "", setup.tank[side] or "",
                                  (p2b_msgs, p2b_bundle), kib_msgs, setup.timeout,
                                  CpuMeter(setup.servers) if setup.servers else None)
            for key, measure in measures.items():
                _add(measure, side, round_, got[key])
            if cpu is not None:
                measures["p2b"].cpu[side].append(cpu)
    return list(measures.values())


# ----------------------------------------------------------------- the command


def _loopback(text: str) -> str:
    host, _, port = text.rpartition(":")
    try:
        number_ = int(port)
        addresses = {info[4][0] for info in socket.getaddrinfo(host.strip("[]"), number_)}
    except (ValueError, OSError) as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise argparse.ArgumentTypeError(f"{text}: not a loopback address (the servers "
                                         "are compared on this machine)")
    return text


DURABILITIES = ("fsync", "os")


def _modes(text: str) -> list[str]:
    """``fsync``, ``os`` or both, comma-separated: the durabilities to start figtank with."""
    modes = [mode.strip() for mode in text.split(",") if mode.strip()]
    if not modes or any(mode not in DURABILITIES for mode in modes) or \
            len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"{text!r}: give fsync, os or fsync,os")
    return modes


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--figg-bench", metavar="PATH", help="the Figg project's figg-bench")
    p.add_argument("--tank-cli", metavar="PATH", help="the Tank project's tank-cli")
    p.add_argument("--peer-figg", type=_loopback, metavar="HOST:PORT",
                   help="the peer Figg server")
    p.add_argument("--peer-tank", type=_loopback, metavar="HOST:PORT",
                   help="the peer Tank broker")
    p.add_argument("--figtank-figg", type=_loopback, metavar="HOST:PORT",
                   help="figtank's Figg listener")
    p.add_argument("--figtank-tank", type=_loopback, metavar="HOST:PORT",
                   help="figtank's Tank listener")
    p.add_argument("--start-figtank", type=_modes, metavar="MODES",
                   help="start figtank serve here with this durability (fsync, os, or "
                        "fsync,os: the Figg measures against each, Tank's against os) "
                        "instead of --figtank-figg/--figtank-tank")
    p.add_argument("--gateway", action="store_true",
                   help="with --start-figtank MODE: measure a gateway (figtank serve "
                        "--upstream-kafka) in front of that figtank's Kafka listener "
                        "against the figtank itself: the peer columns are the figtank "
                        "store straight, the figtank columns the gateway in front of it")
    p.add_argument("--rounds", type=_positive, default=3, help="runs of each side (default 3)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every message count (0.05 for a quick look)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds one client run may take before it is killed")
    p.add_argument("--figg-name", default="figg", help="the peer Figg server's column name")
    p.add_argument("--tank-name", default="tank", help="the peer Tank broker's column name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


@contextlib.contextmanager
def _figtank(mode: str | None) -> Iterator[tuple[str | None, str | None]]:
    if mode is None:
        yield None, None
        return
    with serve_figtank(durability=mode) as served:
        yield served.figg, served.tank


@contextlib.contextmanager
def _figtank_behind_a_gateway(mode: str) -> Iterator[tuple[Served, Served]]:
    """A figtank (``mode``) with its Kafka listener, and a gateway in front of it."""
    with serve_figtank("--kafka-listen", "127.0.0.1:0", durability=mode) as upstream, \
            serve_figtank("--upstream-kafka", upstream.kafka, "--kafka-listen", "",
                          durability=mode) as gateway:
        yield upstream, gateway


def tank_mode(modes: Sequence[str]) -> str:
    """Which of the started figtanks the Tank measures run against: ``os`` when started
    (what a Tank broker does), else the one there is."""
    return "os" if "os" in modes else modes[-1]


def notes(setup: Setup, figtank_mode: str | None, names: dict[str, str]) -> list[str]:
    """The footnote of the tables."""
    out = [f"Medians of {setup.rounds} round(s) a side, the peer and figtank alternating "
           "(the side that goes first swaps every round), the same client binary and "
           "options on both; ratio: figtank's throughput over the peer's (above 1: "
           "figtank is faster). (failed k/n): k of n rounds gave no figure (see --json).",
           "figtank durability: " + (f"{figtank_mode} (started here, a fresh store each)."
                                     if figtank_mode
                                     else "as the running figtank was started.")]
    if setup.figg["peer"]:
        out.append(f"{names['figg']}: the Go Figg server does not fsync. figg-bench times "
                   "publishing from the first ACK to the last; its publishers run one "
                   "after another (each publishes all its messages before the next one "
                   "starts), so --pubs 4 is one publisher at a time beside 4 subscribers; "
                   "with several subscribers \"sub stats\" adds them up; resumers read the "
                   "history after publishing.")
    if setup.tank["peer"]:
        out.append(f"{names['tank']}: a Tank broker acknowledges once the data is in the "
                   "page cache (like figtank's `os` mode). bm p2b sends every bundle in one "
                   "request and stops at the first ACK; its client Snappy-compresses "
                   "bundles of more than 512 messages or 1 KiB, and every message is the "
                   "same, so it measures bulk ingest of well-compressed data. The consume "
                   "wall clock includes starting tank-cli and connecting; its message count "
                   "is taken from the per-response lines (its total counts twice).")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.start_figtank and (args.figtank_figg or args.figtank_tank):
        parser().error("--start-figtank starts figtank itself: leave out "
                       "--figtank-figg/--figtank-tank")
    if args.gateway:
        if not args.start_figtank or len(args.start_figtank) != 1:
            parser().error("--gateway needs --start-figtank with one mode (os or fsync)")
        return _gateway_main(args)
    ours = args.start_figtank is not None
    want_figg = bool(args.figg_bench and args.peer_figg and (ours or args.figtank_figg))
    want_tank = bool(args.tank_cli and args.peer_tank and (ours or args.figtank_tank))
    if not (want_figg or want_tank):
        print("nothing to measure: give --figg-bench with --peer-figg and figtank's Figg "
              "endpoint, and/or --tank-cli with --peer-tank and figtank's Tank endpoint",
              file=sys.stderr)
        return 2
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    names = {"figg": args.figg_name, "tank": args.tank_name}
    modes: list[str | None] = list(args.start_figtank or [None])
    labelled = len(modes) > 1
    tables: dict[str, list[Measure]] = {"figg": [], "tank": []}
    for mode in modes:
        run_tank = want_tank and (mode is None or mode == tank_mode(args.start_figtank))
        if not (want_figg or run_tank):
            continue
        with _figtank(mode) as (figg, tank):
            setup = Setup(args.rounds, args.scale, args.timeout, args.figg_bench,
                          args.tank_cli,
                          {"peer": args.peer_figg, "figtank": figg or args.figtank_figg},
                          {"peer": args.peer_tank, "figtank": tank or args.figtank_tank})
            if want_figg:
                tables["figg"] += figg_measures(setup, mode if labelled else None)
            if run_tank:
                tables["tank"] += tank_measures(setup, mode if labelled else None)
    tables = {group: measures for group, measures in tables.items() if measures}
    footnote = notes(setup, ", ".join(f"`{m}`" for m in args.start_figtank)
                     if args.start_figtank else None, names)
    if args.json:
        print(json.dumps({
            "started_at": started_at, "figtank_version": figtank_version(),
            "machine": machine_info(), "rounds": args.rounds, "scale": args.scale,
            "figtank_durability": ",".join(args.start_figtank or []) or None,
            "endpoints": {"figg": setup.figg, "tank": setup.tank}, "names": names,
            "measures": [m.to_dict() for ms in tables.values() for m in ms],
            "notes": footnote}, indent=1))
    else:
        print(f"figtank {figtank_version()} beside its peers, {started_at}, "
              f"{describe_machine(machine_info())}\n")
        for group, measures in tables.items():
            print(f"{'Figg (figg-bench)' if group == 'figg' else 'Tank (tank-cli)'}\n")
            print(markdown_table(measures, names[group]) + "\n")
        print(" ".join(footnote))
    return 1 if any(m.failures["figtank"] for ms in tables.values() for m in ms) else 0


def _gateway_main(args: argparse.Namespace) -> int:
    """``--gateway``: the peers' clients straight at a figtank and through a gateway in
    front of its Kafka listener (issue 35's table)."""
    if not (args.figg_bench or args.tank_cli):
        print("nothing to measure: give --figg-bench and/or --tank-cli", file=sys.stderr)
        return 2
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    mode = args.start_figtank[0]
    tables: dict[str, list[Measure]] = {}
    with _figtank_behind_a_gateway(mode) as (upstream, gateway):
        setup = Setup(args.rounds, args.scale, args.timeout, args.figg_bench, args.tank_cli,
                      {"peer": upstream.figg, "figtank": gateway.figg},
                      {"peer": upstream.tank, "figtank": gateway.tank},
                      {"upstream": upstream.process.pid, "gateway": gateway.process.pid})
        if args.figg_bench:
            tables["figg"] = figg_measures(setup)
        if args.tank_cli:
            tables["tank"] = tank_measures(setup)
    names = {"figg": f"figtank `{mode}`", "tank": f"figtank `{mode}`"}
    print(f"figtank {figtank_version()}: a gateway (figtank serve --upstream-kafka) in "
          f"front of a figtank ({mode}) against that figtank itself, {started_at}, "
          f"{describe_machine(machine_info())}\n")
    for group, measures in tables.items():
        print(f"{'Figg (figg-bench)' if group == 'figg' else 'Tank (tank-cli)'}; the "
              f"'figtank' column is the gateway, the peer column the figtank behind it\n")
        print(markdown_table(measures, names[group]) + "\n")
    cores = os.cpu_count() or 1
    print("CPU per message of each process around each run (the client's, the figtank's "
          "behind the gateway, the gateway's; medians), and the rate that CPU allows here "
          "(every process sharing the cores, none faster than one core):\n")
    print(cpu_table([m for ms in tables.values() for m in ms],
                    {"peer": "straight", "figtank": "through the gateway"}, cores) + "\n")
    return 1 if any(m.failures["figtank"] for ms in tables.values() for m in ms) else 0


if __name__ == "__main__":
    sys.exit(main())
