"""``make bench``: a fixed set of scenarios, against figtank or another broker.

``python -m gateway.bench.suite`` starts figtank itself (embedded store in a temporary
directory) once per durability mode, runs the set against it, and writes
``bench-results.json`` (every report) and ``bench-results.md`` (a short table, with each
throughput as a share of the loopback ceiling measured in the same run).

Against another broker: ``python -m gateway.bench.suite --target tank-4.0 --tank
HOST:PORT`` (and/or ``--figg HOST:PORT``, ``--kafka HOST:PORT``) runs the scenarios that
broker's protocols allow.

Beside a peer: ``python -m gateway.bench.suite --peer tank-4.0 --peer-tank HOST:PORT``
(and/or ``--peer-figg HOST:PORT``, a peer already running) runs every case the peer's
protocols allow against figtank (per durability mode) and against the peer, alternating,
``--rounds`` times each, and writes the median msgs/s of both sides and their ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.bench.command import BenchError, address, bench
from gateway.bench.report import describe_machine, figtank_version, machine_info
from gateway.bench.scenarios import get_scenario
from gateway.bench.serving import serve_figtank
from gateway.core.logs import configure_logging


@dataclass(frozen=True)
class Case:
    """One scenario run of the suite: a name for the table and the command's options."""

    name: str
    argv: tuple[str, ...]
    #: Options whose value is a message count, scaled by ``--scale``.
    scaled: tuple[str, ...] = ("--messages", "--backlog")


#: The fixed set (sized so the whole suite takes a few minutes on 2 cores).
CASES: Final = (
    Case("tank-produce 100 B", ("tank-produce", "--messages", "300000", "--size", "100",
                                "--bundle", "100", "--in-flight", "8")),
    Case("tank-produce 1 KB", ("tank-produce", "--messages", "100000", "--size", "1000",
                               "--bundle", "100", "--in-flight", "8")),
    Case("tank-consume 1 KB", ("tank-consume", "--messages", "300000", "--size", "1000",
                               "--fetch-size", "1048576")),
    Case("tank-consume 1 KB raw", ("tank-consume", "--messages", "300000", "--size", "1000",
                                   "--fetch-size", "1048576", "--raw")),
    Case("figg-publish x1", ("figg-publish", "--messages", "150000", "--size", "100")),
    Case("figg-publish x4", ("figg-publish", "--messages", "150000", "--size", "100",
                             "--publishers", "4", "--procs", "2")),
    Case("figg-subscribe", ("figg-subscribe", "--messages", "50000", "--backlog", "50000",
                            "--size", "100", "--live", "2", "--resuming", "2",
                            "--procs", "2")),
    Case("e2e 1000/s", ("e2e", "--rate", "1000", "--duration", "5", "--size", "100")),
    Case("kafka-produce 100 B", ("kafka-produce", "--messages", "200000", "--size", "100")),
    Case("kafka-consume 1 KB", ("kafka-consume", "--messages", "200000", "--size", "1000")),
)
#: Run first and last: the machine is shared, so the ceiling is the better of the two.
LOOPBACK: Final = ("loopback", "--duration", "3")


def _scaled(case: Case, scale: float) -> list[str]:
    argv = list(case.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg in case.scaled:
            argv[i + 1] = str(max(1, round(int(argv[i + 1]) * scale)))
    if "--duration" in argv and scale < 1:  # a smoke run: shorter timed runs too
        i = argv.index("--duration")
        argv[i + 1] = str(max(0.2, float(argv[i + 1]) * scale))
    return argv


def _run(case: Case, argv: list[str], runs: list[dict[str, Any]], mode: str,
         **extra: object) -> None:
    where = "".join(f", {key} {value}" for key, value in extra.items())
    print(f"== {case.name} ({mode}{where})", file=sys.stderr, flush=True)
    entry: dict[str, Any] = {"case": case.name, "durability": mode, **extra, "argv": argv}
    try:
        report = bench(argv)
    except BenchError as exc:
        print(f"   failed: {exc}", file=sys.stderr, flush=True)
        entry["error"] = str(exc)
        entry["reason"] = str(exc).strip().splitlines()[-1]
    else:
        print(report.table(), flush=True)
        entry["report"] = report.to_dict()
    runs.append(entry)


def run_suite(*, scale: float = 1.0, modes: Sequence[str] = ("fsync", "os"),
              target: str | None = None, tank: str | None = None, figg: str | None = None,
              kafka: str | None = None) -> dict[str, Any]:
    """Run the set; the results as written to ``bench-results.json``."""
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    loopback = Case("loopback first", LOOPBACK)
    _run(loopback, _scaled(loopback, scale), runs, "-")
    if target is None:
        for mode in modes:
            with serve_figtank("--kafka-listen", "127.0.0.1:0", durability=mode) as served:
                common = ["--tank", served.tank, "--figg", served.figg, "--kafka",
                          served.kafka, "--target", f"figtank-embedded-{mode}",
                          "--server-pid", str(served.process.pid)]
                for case in CASES:
                    _run(case, _scaled(case, scale) + common, runs, mode)
    else:
        have = {name for name, address in (("tank", tank), ("figg", figg), ("kafka", kafka))
                if address}
        common = _endpoint_args(target, tank, figg) + (["--kafka", kafka] if kafka else [])
        for case in CASES:
            argv = _for_protocols(_scaled(case, scale), have)
            if argv is not None:
                _run(case, argv + common, runs, "-")
    loopback = Case("loopback last", LOOPBACK)
    _run(loopback, _scaled(loopback, scale), runs, "-")
    return {"started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "figtank_version": figtank_version(), "machine": machine_info(),
            "scale": scale, "seconds": time.monotonic() - started, "runs": runs}


def _endpoint_args(target: str, tank: str | None, figg: str | None) -> list[str]:
    return (["--target", target] + (["--tank", tank] if tank else [])
            + (["--figg", figg] if figg else []))


def _for_protocols(argv: list[str], have: set[str]) -> list[str] | None:
    """``argv`` cut down to what a broker speaking ``have`` can run (e2e: only the paths
    between those protocols), or None when it can run none of it."""
    if argv[0] == "e2e":
        paths = [p for p in ("figg-tank", "tank-figg", "figg-figg", "tank-tank")
                 if set(p.split("-")) <= have]
        return [*argv, "--paths", *paths] if paths else None
    return argv if get_scenario(argv[0]).needs <= have else None


def run_comparison(*, peer: str, peer_tank: str | None = None, peer_figg: str | None = None,
                   scale: float = 1.0, modes: Sequence[str] = ("fsync", "os"),
                   rounds: int = 3, cases: Sequence[Case] = CASES) -> dict[str, Any]:
    """Run every case the peer's protocols allow against figtank (started once per mode)
    and against the peer (already running), alternating, ``rounds`` times each; the
    results as written to ``bench-results.json``, with the medians in ``comparison``.

    Both sides run the same options (an e2e case only the paths the peer speaks); the
    side that goes first swaps every round, so neither always runs on a warmer or
    more tired machine.
    """
    started = time.monotonic()
    have = {name for name, address in (("tank", peer_tank), ("figg", peer_figg)) if address}
    if not have:
        raise ValueError("the peer needs a Tank and/or a Figg endpoint")
    runs: list[dict[str, Any]] = []
    planned = [(case, _for_protocols(_scaled(case, scale), have)) for case in cases]
    skipped = [case.name for case, argv in planned if argv is None]
    peer_args = _endpoint_args(peer, peer_tank, peer_figg)
    for mode in modes:
        with serve_figtank(durability=mode) as served:
            figtank_args = ["--tank", served.tank, "--figg", served.figg, "--target",
                            f"figtank-embedded-{mode}", "--server-pid",
                            str(served.process.pid)]
            for case, argv in planned:
                if argv is None:
                    continue
                for round_ in range(1, rounds + 1):
                    sides = [("figtank", figtank_args), ("peer", peer_args)]
                    for side, common in sides if round_ % 2 else sides[::-1]:
                        _run(case, argv + common, runs, mode, side=side, round=round_)
    return {"started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "figtank_version": figtank_version(), "machine": machine_info(),
            "scale": scale, "seconds": time.monotonic() - started,
            "peer": {"name": peer, "tank": peer_tank, "figg": peer_figg},
            "rounds": rounds, "skipped": skipped, "runs": runs,
            "comparison": compare(runs)}


def _side_summary(rounds: list[tuple[float, bool]], broken: int, runs: int
                  ) -> dict[str, Any]:
    """One side of a comparison row from its rounds' ``(msgs/s, checks passed)``."""
    passed = [figure for figure, ok in rounds if ok]
    figures = passed or [figure for figure, _ in rounds]
    return {"msgs_per_s": statistics.median(figures) if figures else None,
            "passed": bool(passed), "values": [figure for figure, _ in rounds],
            "failed": broken + len(rounds) - len(passed), "runs": runs}


def compare(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (case, durability, row of the report) with each side's median msgs/s.

    A side's median is over its rounds that passed their count checks; when none did,
    over every round that gave a figure (``passed`` false), and when none ran, None.
    ``failed`` counts the rounds that failed a check or could not run. ``ratio`` is
    figtank / peer, only when both sides have a round that passed (a figure from a run
    that lost messages measures the loss, not the broker).
    """
    order: list[tuple[str, str]] = []
    per_side: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        key = (run["case"], run["durability"])
        if key not in order:
            order.append(key)
        per_side.setdefault((*key, run["side"]), []).append(run)
    out = []
    for case, durability in order:
        labels: list[str] = []
        sides: dict[str, tuple[dict[str, list[tuple[float, bool]]], int, int]] = {}
        for side in ("figtank", "peer"):
            side_runs = per_side.get((case, durability, side), [])
            rounds: dict[str, list[tuple[float, bool]]] = {}
            for run in side_runs:
                report = run.get("report")
                if not report:
                    continue
                for row in report["rows"]:
                    if row["label"] not in labels:
                        labels.append(row["label"])
                    rounds.setdefault(row["label"], []).append(
                        (row["msgs_per_s"], report["ok"]))
            broken = sum("report" not in run for run in side_runs)
            sides[side] = (rounds, broken, len(side_runs))
        for label in labels or ["-"]:
            entry: dict[str, Any] = {"case": case, "durability": durability, "what": label}
            for side, (rounds, broken, count) in sides.items():
                entry[side] = _side_summary(rounds.get(label, []), broken, count)
            mine, theirs = entry["figtank"], entry["peer"]
            entry["ratio"] = (mine["msgs_per_s"] / theirs["msgs_per_s"]
                              if mine["passed"] and theirs["passed"]
                              and theirs["msgs_per_s"] else None)
            out.append(entry)
    return out


def _figure(side: dict[str, Any]) -> str:
    """A median for the table, with how many rounds failed."""
    if side["msgs_per_s"] is None:
        return "no figure" if side["runs"] else ""
    text = f"{side['msgs_per_s']:,.0f}"
    if side["failed"]:
        text += f" (failed {side['failed']}/{side['runs']})"
    return text


def comparison_markdown(results: dict[str, Any]) -> str:
    """The figtank-beside-a-peer table for people."""
    peer = results["peer"]
    name = peer["name"]
    where = ", ".join(f"{proto} {peer[proto]}" for proto in ("tank", "figg") if peer[proto])
    lines = [
        f"figtank {results['figtank_version']} beside {name} ({where}), "
        f"{results['started_at']}, {describe_machine(results['machine'])}; "
        f"{results['rounds']} round(s) a side; took {results['seconds']:.0f} s.",
        "",
        f"| case | durability | what | figtank msgs/s | {name} msgs/s | ratio |",
        "|---|---|---|--:|--:|--:|",
    ]
    for entry in results["comparison"]:
        ratio = "" if entry["ratio"] is None else f"{entry['ratio']:.2f}"
        lines.append(f"| {entry['case']} | {entry['durability']} | {entry['what']} "
                     f"| {_figure(entry['figtank'])} | {_figure(entry['peer'])} | {ratio} |")
    notes = [
        f"msgs/s: the median of {results['rounds']} round(s) a side, figtank and {name} "
        "alternating (the side that goes first swaps every round), same scenario options "
        f"on both; ratio: figtank / {name} (above 1: figtank is faster).",
        f"durability: figtank's mode, the same {name} in every row.",
    ]
    if peer["tank"]:
        notes.append("For reference, a Tank broker acknowledges a produce once it is "
                     "written to the page cache, without fsync (like figtank's `os` mode).")
    if peer["figg"]:
        notes.append("For reference, the Go Figg server never fsyncs (it keeps its log in "
                     "memory and writes full segments without fsync).")
    notes.append("(failed k/n): k of n rounds lost or duplicated messages or could not "
                 "run (see bench-results.json); the median is of the rounds that passed, "
                 "or of every round when none did, and then there is no ratio.")
    if results["skipped"]:
        notes.append(f"Not run ({name} lacks the protocol): "
                     f"{', '.join(results['skipped'])}.")
    lines += ["", " ".join(notes)]
    return "\n".join(lines) + "\n"


def loopback_mb_s(results: dict[str, Any]) -> float | None:
    """The ceiling: the best loopback MB/s of the suite."""
    return max((run["report"]["rows"][0]["mb_per_s"] for run in results["runs"]
                if run["case"].startswith("loopback") and "report" in run), default=None)


def _ms(latency: dict[str, float] | None, key: str) -> str:
    return f"{latency[key] * 1e3:.2f}" if latency else ""


def markdown(results: dict[str, Any]) -> str:
    """The short table for people (and docs/benchmarks.md)."""
    ceiling = loopback_mb_s(results)
    lines = [
        f"figtank {results['figtank_version']}, {results['started_at']}, "
        f"{describe_machine(results['machine'])}; suite took {results['seconds']:.0f} s.",
        "",
        "| case | durability | what | msgs/s | MB/s | % of loopback | p50 ms | p99 ms "
        "| p99.9 ms | max ms | generator cores | server cores | check |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for run in results["runs"]:
        if "report" not in run:
            lines.append(f"| {run['case']} | {run['durability']} | | | | | | | | | | | "
                         f"error: {run['reason']} |")
            continue
        report = run["report"]
        server = report["server"]["busy_cores"] if report["server"] else None
        check = "ok" if report["ok"] else "FAILED"
        for row in report["rows"]:
            # A fixed offered rate says nothing about the ceiling.
            share = (f"{row['mb_per_s'] / ceiling:.1%}"
                     if ceiling and row["latency_of"] != "end-to-end" else "")
            latency = row["latency"]
            lines.append(
                f"| {run['case']} | {run['durability']} | {row['label']} "
                f"| {row['msgs_per_s']:,.0f} | {row['mb_per_s']:,.1f} | {share} "
                f"| {_ms(latency, 'p50')} | {_ms(latency, 'p99')} | {_ms(latency, 'p999')} "
                f"| {_ms(latency, 'max')} | {report['generator']['busy_cores']:.2f} "
                f"| {'' if server is None else f'{server:.2f}'} | {check} |")
    lines += ["", f"% of loopback: MB/s over the better loopback run ({ceiling or 0:,.0f} "
              "MB/s). MB/s counts message payload bytes (raw consume: chunk bytes); latency "
              "columns: Tank produce request, Figg ack, publish->deliver or end-to-end (see "
              "the JSON for which); cores: CPU seconds over wall seconds."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.suite",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("."),
                        help="where bench-results.json and bench-results.md go")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every message count (0.01 for a smoke run)")
    parser.add_argument("--modes", nargs="+", choices=("fsync", "os"),
                        default=["fsync", "os"], help="figtank durability modes to run")
    parser.add_argument("--target", default=None,
                        help="run against another broker named so (needs --tank/--figg/"
                             "--kafka)")
    parser.add_argument("--tank", default=None, help="that broker's Tank HOST:PORT")
    parser.add_argument("--figg", default=None, help="that broker's Figg HOST:PORT")
    parser.add_argument("--kafka", default=None, help="that broker's Kafka HOST:PORT")
    parser.add_argument("--peer", default=None, metavar="NAME",
                        help="also run every case against this running broker, named so "
                             "in the table (needs --peer-tank/--peer-figg), and report "
                             "figtank beside it")
    parser.add_argument("--peer-tank", type=address, default=None, metavar="HOST:PORT",
                        help="the peer's Tank endpoint")
    parser.add_argument("--peer-figg", type=address, default=None, metavar="HOST:PORT",
                        help="the peer's Figg endpoint")
    parser.add_argument("--rounds", type=int, default=None,
                        help="with --peer: runs of each case on each side (default 3); "
                             "the table shows the medians")
    args = parser.parse_args(argv)
    configure_logging("warning")
    if args.target and not (args.tank or args.figg or args.kafka):
        parser.error("--target needs --tank, --figg and/or --kafka")
    if args.peer:
        if args.target:
            parser.error("--peer and --target do not go together")
        if not (args.peer_tank or args.peer_figg):
            parser.error("--peer needs --peer-tank and/or --peer-figg")
        if args.rounds is not None and args.rounds < 1:
            parser.error("--rounds must be at least 1")
    elif args.peer_tank or args.peer_figg or args.rounds is not None:
        parser.error("--peer-tank, --peer-figg and --rounds go with --peer")
    if args.peer:
        results = run_comparison(peer=args.peer, peer_tank=args.peer_tank,
                                 peer_figg=args.peer_figg, scale=args.scale,
                                 modes=args.modes, rounds=args.rounds or 3)
        table = comparison_markdown(results)
    else:
        results = run_suite(scale=args.scale, modes=args.modes, target=args.target,
                            tank=args.tank, figg=args.figg, kafka=args.kafka)
        table = markdown(results)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "bench-results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out_dir / "bench-results.md").write_text(table)
    print(table)
    failed = _failed(results["runs"], "figtank" if args.peer else None)
    if args.peer:
        peer_failed = _failed(results["runs"], "peer")
        if peer_failed:
            print(f"{args.peer} failed: {', '.join(peer_failed)}", file=sys.stderr)
        if not any(entry["peer"]["msgs_per_s"] is not None
                   for entry in results["comparison"]):
            failed.append(f"{args.peer}: no figure at all")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _failed(runs: list[dict[str, Any]], side: str | None) -> list[str]:
    """The cases (of one side of a comparison) that failed or could not run, once each."""
    names = [f"{r['case']} ({r['durability']})" if side else r["case"] for r in runs
             if r.get("side") == side and ("error" in r or not r["report"]["ok"])]
    return list(dict.fromkeys(names))


if __name__ == "__main__":
    sys.exit(main())
