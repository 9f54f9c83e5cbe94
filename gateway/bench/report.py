"""What a benchmark run reports: figures, count checks, load, and where it ran.

A :class:`Report` prints as a table for people (:meth:`Report.table`) and as one JSON
object for programs (:meth:`Report.to_dict`). Every report records the parameters, the
target, the figtank version and the machine.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

MB = 1_000_000


@dataclass
class Row:
    """One measured figure: ``messages`` (and ``payload_bytes``) over ``seconds``."""

    label: str
    messages: int
    seconds: float
    payload_bytes: int
    #: Latency summary in seconds (see :func:`gateway.bench.stats.summarize`).
    latency: dict[str, float] | None = None
    #: What the latency is of: "request", "ack", "end-to-end", "fetch".
    latency_of: str = ""
    #: Messages/s of one client (subscriber, publisher) on average, when several ran.
    per_client: float | None = None
    note: str = ""

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Payload megabytes (10^6) per second."""
        return self.payload_bytes / self.seconds / MB if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "msgs_per_s": self.rate, "mb_per_s": self.mb_per_s}


@dataclass
class Check:
    """A count check: every message that was sent arrived exactly once."""

    what: str
    expected: int
    received: int
    duplicates: int = 0
    unit: str = "messages"
    #: Why the run could not be trusted even with the counts right (e.g. a reconnect).
    problem: str = ""

    @property
    def lost(self) -> int:
        return max(0, self.expected - self.received)

    @property
    def extra(self) -> int:
        return max(0, self.received - self.expected)

    @property
    def ok(self) -> bool:
        return (self.received == self.expected and self.duplicates == 0
                and not self.problem)

    def describe(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        text = (f"{self.what}: {self.received:,} of {self.expected:,} {self.unit}, "
                f"{self.lost:,} lost, {self.duplicates + self.extra:,} duplicated")
        if self.problem:
            text += f"; {self.problem}"
        return f"{text}: {verdict}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lost": self.lost, "ok": self.ok}


@functools.cache
def figtank_version() -> str:
    """The installed figtank version, with the git commit when run from a checkout."""
    try:
        version = metadata.version("figtank")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            commit = subprocess.run(["git", "-C", str(root), "describe", "--always",
                                     "--dirty"], capture_output=True, text=True,
                                    timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
        if commit:
            version += f"+g{commit}"
    return version


@functools.cache
def machine_info() -> dict[str, Any]:
    """What the figures came from: CPU model and count, memory, kernel, Python."""
    model = platform.processor() or platform.machine()
    memory_gb = None
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (OSError, ValueError):
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "memory_gib": memory_gb,
            "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version()}


@dataclass
class Report:
    """The result of one scenario run."""

    scenario: str
    target: str
    params: dict[str, Any]
    rows: list[Row]
    checks: list[Check]
    generator: dict[str, float]
    server: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)
    #: Figures a scenario derives from its rows (ratios, added latency), by name.
    figures: dict[str, Any] = field(default_factory=dict)
    version: str = field(default_factory=lambda: figtank_version())
    machine: dict[str, Any] = field(default_factory=lambda: machine_info())
    started_at: str = field(default_factory=lambda: datetime.datetime.now(
        datetime.UTC).isoformat(timespec="seconds"))

    @property
    def ok(self) -> bool:
        """Whether every count check passed."""
        return all(check.ok for check in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "target": self.target, "ok": self.ok,
                "started_at": self.started_at, "figtank_version": self.version,
                "machine": self.machine, "params": self.params,
                "rows": [row.to_dict() for row in self.rows],
                "checks": [check.to_dict() for check in self.checks],
                "generator": self.generator, "server": self.server, "notes": self.notes,
                "figures": self.figures}

    def table(self) -> str:
        """The report for people: a header line, one table line per row, the checks."""
        lines = [f"figtank bench {self.scenario}  target={self.target}  "
                 f"figtank {self.version}  {self.started_at}"]
        lines += format_rows(self.rows)
        load = self.generator
        lines.append(f"generator: {load['procs']:.0f} proc(s), {load['busy_cores']:.2f} "
                     f"cores busy over {load['wall_s']:.2f} s (busiest proc "
                     f"{load['busiest_proc']:.0%} of a core)"
                     + (f"; server: {self.server['busy_cores']:.2f} cores busy"
                        if self.server else ""))
        lines += [f"check {check.describe()}" for check in self.checks]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


_COLUMNS = ("what", "messages", "msgs/s", "MB/s", "latency of", "p50", "p99", "p99.9",
            "max")


def format_rows(rows: list[Row]) -> list[str]:
    """Rows as aligned text columns (latencies in ms)."""
    table = [list(_COLUMNS)]
    for row in rows:
        lat = row.latency
        table.append([
            row.label, f"{row.messages:,}", f"{row.rate:,.0f}", f"{row.mb_per_s:,.1f}",
            row.latency_of if lat else "",
            *([format_ms(lat[k]) for k in ("p50", "p99", "p999", "max")] if lat
              else ["", "", "", ""])])
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    out = []
    for line in table:
        cells = [line[0].ljust(widths[0]), *(cell.rjust(w)
                                             for cell, w in zip(line[1:], widths[1:],
                                                                strict=True))]
        out.append("  " + "  ".join(cells).rstrip())
    for row in rows:
        if row.note or row.per_client is not None:
            extra = [f"{row.per_client:,.0f} msgs/s per client"] if row.per_client else []
            extra += [row.note] if row.note else []
            out.append(f"  {row.label}: {'; '.join(extra)}")
    return out


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds with sensible precision."""
    ms = seconds * 1e3
    return f"{ms:.3f}ms" if ms < 1 else f"{ms:.2f}ms" if ms < 100 else f"{ms:.0f}ms"


def describe_machine(machine: dict[str, Any]) -> str:
    """One line: "2 x AMD EPYC, 23.5 GiB, Linux 6.1, Python 3.11.2"."""
    return (f"{machine['cpus']} x {machine['cpu']}, {machine['memory_gib']} GiB, "
            f"{machine['system']}, Python {machine['python']}")
