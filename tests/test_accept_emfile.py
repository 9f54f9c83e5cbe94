"""Accept under descriptor exhaustion (issue 15, item 1): a ``figtank serve`` whose
descriptor limit is reached logs one structured ``accept_failed`` line (no traceback),
keeps serving its open connections, and serves new ones, ``/health`` included, as soon as
descriptors are free again."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Callable
from pathlib import Path

from tests.serving import figtank_serve

#: The child's descriptor limit (soft and hard, so start-up can not raise it): figtank
#: needs about 15 at rest, the rest is for connections.
NOFILE = 64
PING = b"\x03\x00\x00\x00\x00"


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=5)


def _greeted(sock: socket.socket, wait: float) -> bool:
    """True when the Tank listener served the connection (its Ping arrived in time)."""
    sock.settimeout(wait)
    try:
        return sock.recv(5) == PING
    except TimeoutError:
        return False


def _get(address: tuple[str, int], path: str, wait: float) -> bytes:
    with socket.create_connection(address, timeout=wait) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                     .encode())
        answer = b""
        while data := sock.recv(65536):
            answer += data
        return answer


def _wait_for(condition: Callable[[], bool], limit: float) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_accept_under_emfile_logs_once_serves_on_and_recovers(tmp_path: Path) -> None:
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--durability", "os",
                       "--tank-listen", "127.0.0.1:0", "--figg-listen", "",
                       "--metrics-listen", "127.0.0.1:0", "--log-level", "info",
                       preexec_fn=_low_nofile) as server:
        assert server.tank is not None and server.metrics is not None
        served: list[socket.socket] = []
        try:
            # Open connections until one is left waiting in the backlog: EMFILE.
            for _ in range(NOFILE):
                sock = _connect(server.tank)
                if not _greeted(sock, 1.0):
                    waiting = sock
                    break
                served.append(sock)
            else:
                raise AssertionError(f"{NOFILE} connections were all served")
            assert len(served) > NOFILE // 2
            _wait_for(lambda: bool(server.events("accept_failed")), 5)
            time.sleep(1.0)  # several retries: still one line
            [failed] = server.events("accept_failed")
            assert failed["listener"] == "tank" and failed["errno"] == "EMFILE"
            assert failed["level"] == "warning"
            assert not server.events("accept_recovered")

            # The open connections are still served: a request gets its answer.
            # (DiscoverTopology: answering it takes no descriptor.)
            served[0].sendall(b"\x0c" + (5).to_bytes(4, "little") + (7).to_bytes(4, "little")
                              + b"\x00")
            served[0].settimeout(5)
            assert served[0].recv(64) == b"\x0c" + (6).to_bytes(4, "little") + \
                (7).to_bytes(4, "little") + b"\xff\xff"

            # Descriptors free up: the waiting connection is served, and /health answers.
            for sock in served[-8:]:
                sock.close()
            del served[-8:]
            assert _greeted(waiting, 5.0)
            assert _get(server.metrics, "/health", 5.0).startswith(b"HTTP/1.1 200")
            _wait_for(lambda: bool(server.events("accept_recovered")), 5)
            [recovered] = server.events("accept_recovered")
            assert recovered["listener"] == "tank" and recovered["retries"] >= 2
            assert recovered["failed_secs"] >= 1.0
            metrics = _get(server.metrics, "/metrics", 5.0)
            assert b'figtank_limit_hits_total{limit="open_files"} 1.0' in metrics
            waiting.close()
        finally:
            for sock in served:
                sock.close()
        assert server.stop() == 0
    assert not [line for line in server.log_lines if "raw" in line], "a line that is not JSON"
    assert len(server.events("accept_failed")) == 1
