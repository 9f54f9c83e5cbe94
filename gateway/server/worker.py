"""One worker process of ``figtank serve --workers N``: ``python -m gateway.server.worker``.

The supervisor (:mod:`gateway.server.workers`) writes the worker's :class:`WorkerJob` on
its stdin (a length-prefixed pickle) and keeps stdin open: its end, the supervisor gone
however it went, stops the worker as a SIGTERM does. Once the worker serves, it writes one
JSON line to the job's report descriptor: its pid and the address of its private metrics
endpoint. Its log lines go to the stderr it shares with the supervisor, each with the
field ``worker`` (its index). Exit status as ``figtank serve``'s: 0 after a signal, 2 a
configuration error, 1 any other failure.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import sys
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from gateway.core.config import ConfigError, Settings
from gateway.core.logs import configure_logging
from gateway.extras import MissingExtra

if TYPE_CHECKING:
    from gateway.server.run import ServerInfo

_LENGTH = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class WorkerJob:
    """What one worker serves: the settings (the listeners' ports fixed, its metrics
    endpoint private), the shutdown's grace, its index and where it reports serving."""

    settings: Settings
    grace: float
    index: int
    report_fd: int

    def encode(self) -> bytes:
        """The job as the worker reads it on its stdin."""
        data = pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)
        return _LENGTH.pack(len(data)) + data


def _read(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise SystemExit("figtank worker: no job on stdin (started by figtank serve "
                             "--workers N only)")
        data += chunk
    return data


def _read_job(fd: int) -> WorkerJob:
    (size,) = _LENGTH.unpack(_read(fd, _LENGTH.size))
    job = pickle.loads(_read(fd, size))
    assert isinstance(job, WorkerJob)
    return job


def _stop_when_orphaned(fd: int) -> None:
    """Wait for the end of stdin (the supervisor is gone), then stop as SIGTERM does.
    Raw reads: a daemon thread blocked in a buffered read would hold its lock at exit."""
    while os.read(fd, 4096):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _report(fd: int, info: ServerInfo) -> None:
    """Tell the supervisor this worker serves, and where its metrics are."""
    metrics = info.addresses.get("metrics")
    line = json.dumps({"pid": os.getpid(),
                       "metrics": f"{metrics[0]}:{metrics[1]}" if metrics else None})
    os.write(fd, line.encode() + b"\n")
    os.close(fd)


def main() -> int:
    """Read the job, serve it until a signal (or the supervisor's end), return the exit
    status."""
    from gateway.server.outcome import run_serving
    from gateway.server.run import serve_until_signalled

    stdin = sys.stdin.fileno()
    job = _read_job(stdin)
    settings = job.settings
    configure_logging(settings.log_level, settings.log_format, fields={"worker": job.index})
    threading.Thread(target=_stop_when_orphaned, args=(stdin,), daemon=True,
                     name="figtank-orphan-watch").start()
    try:
        return run_serving(partial(serve_until_signalled, settings, grace=job.grace,
                                    on_serving=partial(_report, job.report_fd),
                                    worker=job.index), settings)
    except ConfigError as exc:
        print(f"figtank: configuration error: {exc}", file=sys.stderr)
        return 2
    except MissingExtra as exc:
        print(f"figtank serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # The job's class must be the one of gateway.server.worker, which pickle imports,
    # not this __main__'s copy: run main from there.
    from gateway.server.worker import main as worker_main

    sys.exit(worker_main())
