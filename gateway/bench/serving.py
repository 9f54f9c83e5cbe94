"""Start ``figtank serve`` as a child process (benchmarks, and tests/serving.py), and learn
its ports."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


@dataclass
class Served:
    """A running figtank: its process and where it listens (``host:port``)."""

    process: subprocess.Popen[str]
    tank: str
    figg: str
    data_dir: Path
    #: The Kafka listener's ``host:port`` ("" when it is off).
    kafka: str = ""
    #: The HTTP listener's ``host:port`` ("" when it is off).
    http: str = ""


def _pump(stream: IO[str], lines: queue.Queue[str | None] | None,
          on_line: Callable[[str], None]) -> None:
    """Hand the log lines over until the server says it is serving, then keep the pipe
    empty so the server never blocks on its log; every line also goes to ``on_line``."""
    for line in stream:
        on_line(line)
        if lines is not None:
            lines.put(line)
            if '"figtank_serving"' in line:
                lines = None
    if lines is not None:
        lines.put(None)


def start_serve(args: Sequence[str], *, timeout: float = 30.0, cwd: Path | None = None,
                on_line: Callable[[str], None] = lambda line: None,
                preexec_fn: Callable[[], None] | None = None,
                program: Sequence[str] = (sys.executable, "-m", "gateway.cli")
                ) -> tuple[subprocess.Popen[str], dict[str, Any], threading.Thread]:
    """Start ``figtank serve --log-format json *args`` and wait until it logs that it is
    serving: ``(process, that log event, the thread reading its log until it exits)``.
    Every log line goes to ``on_line`` (from that thread); ``preexec_fn`` runs in the
    child before it starts (a resource limit, say); ``program`` is the ``figtank`` to run
    (an installed command, say). Killed if it does not start. The Kafka and HTTP listeners
    are off unless ``args`` name ``--kafka-listen`` or ``--http-listen`` (their default
    ports are fixed, so two servers, or a Kafka broker beside, would collide)."""
    off = [flag for name in ("--kafka-listen", "--http-listen")
           if not any(a.startswith(name) for a in args) for flag in (name, "")]
    command = [*program, "serve", "--log-format", "json", *off, *args]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                               preexec_fn=preexec_fn)
    try:
        assert process.stderr is not None
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(process.stderr, lines, on_line),
                                  daemon=True)
        reader.start()
        return process, _wait_serving(lines, timeout), reader
    except BaseException:
        process.kill()
        process.wait()
        raise


@contextmanager
def serve_figtank(*flags: str, durability: str = "fsync", data_dir: Path | None = None,
                  timeout: float = 30.0) -> Iterator[Served]:
    """Run ``figtank serve`` on ephemeral loopback ports with its store in ``data_dir``
    (a new temporary directory by default) until the block ends."""
    with tempfile.TemporaryDirectory(prefix="figtank-bench-") as scratch:
        where = data_dir or Path(scratch)
        process, event, _ = start_serve(
            ["--log-level", "info", "--data-dir", str(where), "--durability", durability,
             "--tank-listen", "127.0.0.1:0", "--figg-listen", "127.0.0.1:0",
             "--metrics-listen", "", *flags], timeout=timeout)
        try:
            yield Served(process, event["tank"], event["figg"], where, event.get("kafka") or "",
                         event.get("http") or "")
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _wait_serving(lines: queue.Queue[str | None], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("figtank serve did not start in time") from None
        if line is None:
            raise RuntimeError(f"figtank serve exited early: {''.join(seen[-20:])}")
        seen.append(line)
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "figtank_serving":
            serving: dict[str, Any] = event
            return serving
