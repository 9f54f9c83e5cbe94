"""Figg through the bridge against Figg straight to an embedded figtank, in one run.

Starts an embedded figtank (the upstream) and a bridge in front of it, both as
processes on loopback, then runs the same ``figtank bench`` scenarios against each
endpoint in alternating rounds and prints the two side by side::

    .venv/bin/python -m gateway.bench.micro.bridge [--durability os] [--messages 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from gateway.bench.serving import serve_figtank

SCENARIOS = {
    "publish, 1 client": ["figg-publish"],
    "publish, 4 clients": ["figg-publish", "--publishers", "4"],
    "subscribe, 1 live": ["figg-subscribe", "--live", "1", "--resuming", "0"],
}


def run_scenario(figg: str, args: list[str], messages: int, size: int) -> dict[str, Any]:
    """One ``figtank bench`` run against ``figg``; its JSON report."""
    command = [sys.executable, "-m", "gateway.cli", "bench", *args, "--figg", figg,
               "--messages", str(messages), "--size", str(size), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed against {figg}:\n{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def throughput(report: dict[str, Any]) -> float:
    """Messages/s of the report's first row (publish or delivery)."""
    row = report["rows"][0]
    rate: float = row["messages"] / row["seconds"]
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--durability", choices=["fsync", "os"], default="fsync")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with serve_figtank(durability=args.durability) as upstream, \
            serve_figtank("--upstream", upstream.tank, durability=args.durability) as bridge:
        endpoints = {"direct": upstream.figg, "bridge": bridge.figg}
        print(f"Figg {args.messages} x {args.size} B, durability={args.durability}, "
              f"median of {args.rounds} alternating rounds")
        print(f"{'scenario':<22}{'direct msgs/s':>15}{'bridge msgs/s':>15}{'ratio':>8}")
        for name, scenario in SCENARIOS.items():
            rates: dict[str, list[float]] = {kind: [] for kind in endpoints}
            for _ in range(args.rounds):
                for kind, figg in endpoints.items():
                    report = run_scenario(figg, scenario, args.messages, args.size)
                    rates[kind].append(throughput(report))
            direct, bridged = (statistics.median(rates[k]) for k in ("direct", "bridge"))
            print(f"{name:<22}{direct:>15,.0f}{bridged:>15,.0f}{bridged / direct:>8.2f}")


if __name__ == "__main__":
    main()
