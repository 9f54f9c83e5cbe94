"""The server under abuse: a ``figtank serve`` the soak starts, or one already running on
loopback; its resident memory and descriptors, sampled from ``/proc``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

from gateway.bench.serving import start_serve
from gateway.bench.soak.wire import loopback_address

#: The log levels whose events the report counts by name.
_NOTABLE_LEVELS = frozenset({"warning", "error", "critical"})


class ServerLog:
    """What the server logged, counted (never stored: an abused server can log a lot)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lines = 0
        #: Lines that are not JSON: tracebacks and other unstructured output.
        self.unstructured = 0
        #: Warning and error events by name.
        self.notable: Counter[str] = Counter()

    def feed(self, line: str) -> None:
        """Count one line of the server's stderr (called from its reader thread)."""
        with self._lock:
            self.lines += 1
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                self.unstructured += 1
                return
            if isinstance(event, dict) and event.get("level") in _NOTABLE_LEVELS:
                self.notable[str(event.get("event"))] += 1

    def summary(self) -> dict[str, object]:
        with self._lock:
            return {"lines": self.lines, "unstructured_lines": self.unstructured,
                    "warnings_and_errors": dict(self.notable.most_common(15))}


@dataclass
class Target:
    """Where the server listens (``(host, port)``) and its process id."""

    pid: int
    figg: tuple[str, int]
    tank: tuple[str, int]
    metrics: tuple[str, int]
    #: The process, when the soak started it.
    process: subprocess.Popen[str] | None = None
    log: ServerLog | None = None
    settings: dict[str, object] = field(default_factory=dict)
    #: How the soak stopped the server it started (set once it has).
    shutdown: dict[str, object] | None = None

    def alive(self) -> bool:
        """Whether the server process still runs (a zombie does not)."""
        if self.process is not None:
            return self.process.poll() is None
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False


def attached(pid: int, figg: str, tank: str, metrics: str) -> Target:
    """A running server; ValueError when an address is not loopback or ``pid`` is not
    this machine's."""
    if not os.path.isdir(f"/proc/{pid}"):
        raise ValueError(f"no process {pid} on this machine")
    return Target(pid, loopback_address(figg), loopback_address(tank),
                  loopback_address(metrics))


@contextmanager
def own_server(serve_args: Sequence[str], durability: str) -> Iterator[Target]:
    """Start ``figtank serve`` on free loopback ports with a temporary data directory;
    stop it (SIGTERM, then SIGKILL) and remove the directory at the end."""
    with tempfile.TemporaryDirectory(prefix="figtank-soak-") as scratch:
        log = ServerLog()
        process, event, reader = start_serve(
            ["--data-dir", scratch, "--durability", durability,
             "--tank-listen", "127.0.0.1:0", "--figg-listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--log-level", "info", *serve_args],
            on_line=log.feed)
        target = Target(process.pid, loopback_address(event["figg"]),
                        loopback_address(event["tank"]), loopback_address(event["metrics"]),
                        process, log, {"durability": durability, "args": list(serve_args)})
        try:
            yield target
        finally:
            target.shutdown = _stop(process)
            reader.join(timeout=10)


def _stop(process: subprocess.Popen[str], patience: float = 30.0) -> dict[str, object]:
    """SIGTERM, then SIGKILL after ``patience`` seconds: how long it took, the exit
    status, and whether it had to be killed."""
    start = time.monotonic()
    killed = False
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            killed = True
    return {"seconds": round(time.monotonic() - start, 2), "exit_status": process.returncode,
            "killed": killed}


def rss_bytes(pid: int) -> int | None:
    """The process's resident set (VmRSS), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def descriptors(pid: int) -> int | None:
    """How many descriptors the process holds, or None when it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


@dataclass
class Sample:
    rss: int | None
    fds: int | None


def sample(pid: int) -> Sample:
    return Sample(rss_bytes(pid), descriptors(pid))


class Sampler:
    """Peaks of the server's RSS and descriptors, sampled every ``interval`` seconds.

    ``on_rss(rss)`` is called after each sample (the soak's memory guard).
    """

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_rss = 0
        self.peak_fds = 0
        self.samples = 0
        #: Samples taken while the server was gone.
        self.missing = 0

    def take(self) -> Sample:
        now = sample(self.pid)
        self.samples += 1
        if now.rss is None or now.fds is None:
            self.missing += 1
        self.peak_rss = max(self.peak_rss, now.rss or 0)
        self.peak_fds = max(self.peak_fds, now.fds or 0)
        return now

    async def run(self, on_rss: Callable[[int], None] | None = None) -> None:
        """Sample until cancelled."""
        while True:
            now = self.take()
            if on_rss is not None and now.rss is not None:
                on_rss(now.rss)
            await trio.sleep(self.interval)
