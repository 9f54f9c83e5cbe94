"""Run ``figtank serve`` as a real subprocess and learn where it listens."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from gateway.bench.serving import start_serve


@dataclass
class ServeProcess:
    """A running ``figtank serve``: its process, addresses and captured log lines."""

    process: subprocess.Popen
    tank: tuple[str, int] | None
    figg: tuple[str, int] | None
    metrics: tuple[str, int] | None
    log_lines: list[dict] = field(default_factory=list)
    _drain: threading.Thread | None = None
    kafka: tuple[str, int] | None = None
    http: tuple[str, int] | None = None

    def events(self, name: str) -> list[dict]:
        """Log lines whose event is ``name``."""
        return [line for line in self.log_lines if line.get("event") == name]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Send ``sig`` and wait for the exit code (and the last log lines)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        if self._drain is not None:
            self._drain.join(timeout=5)
        return self.process.returncode


def _parse_lines(text: str) -> list[dict]:
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            lines.append({"raw": line})
    return lines


def _address(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    return host, int(port)


@contextmanager
def figtank_serve(*args: str, cwd: Path | None = None, timeout: float = 30,
                  preexec_fn: Callable[[], None] | None = None,
                  program: Sequence[str] | None = None) -> Iterator[ServeProcess]:
    """Start ``figtank serve`` with JSON logs; yield once it says it is serving. Its log
    lines keep being read into ``log_lines`` (so a chatty server never blocks on the pipe).
    ``preexec_fn`` runs in the child before it starts (e.g. a low RLIMIT_NOFILE);
    ``program`` is the ``figtank`` to run (default: this interpreter's)."""
    lines: list[dict] = []
    process, event, drain = start_serve(args, timeout=timeout, cwd=cwd,
                                        on_line=lambda line: lines.extend(_parse_lines(line)),
                                        preexec_fn=preexec_fn,
                                        **({"program": program} if program else {}))
    try:
        yield ServeProcess(process, _address(event.get("tank")), _address(event.get("figg")),
                           _address(event.get("metrics")), lines, drain,
                           _address(event.get("kafka")), _address(event.get("http")))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


class Served:
    """``figtank_serve`` entered in a worker thread, so trio keeps running meanwhile."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self._cm: AbstractContextManager[ServeProcess] | None = None
        self.process: ServeProcess | None = None

    async def start(self) -> ServeProcess:
        self._cm = figtank_serve(*self.args)
        self.process = await trio.to_thread.run_sync(self._cm.__enter__)
        return self.process

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop it with ``sig`` (waiting in a worker thread); its exit status."""
        assert self.process is not None
        code = await trio.to_thread.run_sync(self.process.stop, sig)
        self.close()
        return code

    async def kill(self) -> None:
        assert self.process is not None
        await trio.to_thread.run_sync(self.process.stop, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
            self._cm = None
