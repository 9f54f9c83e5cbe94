"""``make bench``: a fixed set of scenarios, against figtank or another broker.

``python -m gateway.bench.suite`` starts figtank itself (embedded store in a temporary
directory) once per durability mode, runs the set against it, and writes
``bench-results.json`` (every report) and ``bench-results.md`` (a short table, with each
throughput as a share of the loopback ceiling measured in the same run).

Against another broker: ``python -m gateway.bench.suite --target tank-4.0 --tank
HOST:PORT`` (and/or ``--figg HOST:PORT``) runs the scenarios that broker's protocols allow.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.bench.cli import BenchError, bench
from gateway.bench.report import describe_machine, figtank_version, machine_info
from gateway.bench.scenario import get_scenario
from gateway.bench.serving import serve_figtank
from gateway.logs import configure_logging


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


def _run(case: Case, argv: list[str], runs: list[dict[str, Any]], mode: str) -> None:
    print(f"== {case.name} ({mode})", file=sys.stderr, flush=True)
    entry: dict[str, Any] = {"case": case.name, "durability": mode, "argv": argv}
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
              target: str | None = None, tank: str | None = None, figg: str | None = None
              ) -> dict[str, Any]:
    """Run the set; the results as written to ``bench-results.json``."""
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    loopback = Case("loopback first", LOOPBACK)
    _run(loopback, _scaled(loopback, scale), runs, "-")
    if target is None:
        for mode in modes:
            with serve_figtank(durability=mode) as served:
                common = ["--tank", served.tank, "--figg", served.figg, "--target",
                          f"figtank-embedded-{mode}", "--server-pid", str(served.process.pid)]
                for case in CASES:
                    _run(case, _scaled(case, scale) + common, runs, mode)
    else:
        have = {name for name, address in (("tank", tank), ("figg", figg)) if address}
        common = ["--target", target]
        common += ["--tank", tank] if tank else []
        common += ["--figg", figg] if figg else []
        for case in CASES:
            argv = _scaled(case, scale)
            needs = get_scenario(argv[0]).needs
            if argv[0] == "e2e":
                paths = [p for p in ("figg-tank", "tank-figg", "figg-figg", "tank-tank")
                         if set(p.split("-")) <= have]
                if not paths:
                    continue
                argv += ["--paths", *paths]
            elif not needs <= have:
                continue
            _run(case, argv + common, runs, "-")
    loopback = Case("loopback last", LOOPBACK)
    _run(loopback, _scaled(loopback, scale), runs, "-")
    return {"started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "figtank_version": figtank_version(), "machine": machine_info(),
            "scale": scale, "seconds": time.monotonic() - started, "runs": runs}


def loopback_mb_s(results: dict[str, Any]) -> float | None:
    """The ceiling: the best loopback MB/s of the suite."""
    return max((run["report"]["rows"][0]["mb_per_s"] for run in results["runs"]
                if run["case"].startswith("loopback") and "report" in run), default=None)


def _ms(latency: dict[str, float] | None, key: str) -> str:
    return f"{latency[key] * 1e3:.2f}" if latency else ""


def markdown(results: dict[str, Any]) -> str:
    """The short table for people (and the README)."""
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
                        help="run against another broker named so (needs --tank/--figg)")
    parser.add_argument("--tank", default=None, help="that broker's Tank HOST:PORT")
    parser.add_argument("--figg", default=None, help="that broker's Figg HOST:PORT")
    args = parser.parse_args(argv)
    configure_logging("warning")
    if args.target and not (args.tank or args.figg):
        parser.error("--target needs --tank and/or --figg")
    results = run_suite(scale=args.scale, modes=args.modes, target=args.target,
                        tank=args.tank, figg=args.figg)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "bench-results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = markdown(results)
    (args.out_dir / "bench-results.md").write_text(table)
    print(table)
    failed = [r["case"] for r in results["runs"]
              if "error" in r or not r["report"]["ok"]]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
