"""nginx (Debian's package) as a subprocess in front of a test's server, configured by the
shipped ``deploy/nginx/figtank.conf`` with only its addresses replaced."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from tests.ports import free_port

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "figtank.conf"
#: The addresses the shipped file names, which a test replaces with its own.
UPSTREAM = "server 127.0.0.1:8080;"
LISTEN = "listen 80;"


def nginx_binary() -> str:
    """nginx on PATH, or where Debian installs it (/usr/sbin is not on every PATH)."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    assert found, "nginx is not installed (make system-tools installs Debian's package)"
    return found


def nginx_version() -> str:
    """``nginx/1.22.1``: what ``nginx -v`` says (on stderr)."""
    result = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True,
                            timeout=10, check=True)
    return result.stderr.strip().rsplit(" ", 1)[-1]




def server_block(upstream_port: int, listen_port: int,
                 edit: Callable[[str], str] | None = None) -> str:
    """The shipped file, pointed at ``127.0.0.1:upstream_port`` and listening on
    ``127.0.0.1:listen_port`` (``edit``: a further change, for a test that shows what a
    setting is for)."""
    text = SHIPPED.read_text()
    for old, new in ((UPSTREAM, f"server 127.0.0.1:{upstream_port};"),
                     (LISTEN, f"listen 127.0.0.1:{listen_port};")):
        assert len(re.findall(rf"^\s*{re.escape(old)}", text, re.MULTILINE)) == 1, old
        text = text.replace(old, new)
    return edit(text) if edit else text


def wrapper(prefix: Path, included: Path) -> str:
    """An nginx.conf of the test's own around the server block: one process (no workers
    to outlive it, no switch to another user), every path under ``prefix``."""
    return f"""
master_process off;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {included};
}}
"""


def start(prefix: Path, upstream_port: int, edit: Callable[[str], str] | None
          ) -> tuple[subprocess.Popen[bytes], int] | None:
    """nginx on a free port, once it listens; None when the port was taken meanwhile."""
    port = free_port()
    included = prefix / "figtank.conf"
    included.write_text(server_block(upstream_port, port, edit))
    config = prefix / "nginx.conf"
    config.write_text(wrapper(prefix, included))
    pid = prefix / "nginx.pid"
    pid.unlink(missing_ok=True)
    log = prefix / "stderr.log"
    with log.open("wb") as err:
        process = subprocess.Popen(
            [nginx_binary(), "-p", str(prefix), "-c", str(config),
             "-g", f"daemon off; pid {pid}; error_log stderr info;"],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    # nginx writes its pid file once its sockets are bound, or exits.
    deadline = time.monotonic() + 10
    while not pid.exists():
        if process.poll() is not None:
            if "Address already in use" in log.read_text():
                return None
            raise AssertionError(f"nginx did not start: {log.read_text()}")
        assert time.monotonic() < deadline, f"nginx did not start: {log.read_text()}"
        time.sleep(0.01)
    return process, port


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@asynccontextmanager
async def nginx_in_front(upstream_port: int, tmp_path: Path,
                         edit: Callable[[str], str] | None = None
                         ) -> AsyncIterator[int]:
    """Run nginx with the shipped server block in front of ``127.0.0.1:upstream_port``
    until the block ends; yields the loopback port it listens on."""
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    for _ in range(3):
        started = start(prefix, upstream_port, edit)
        if started is not None:
            break
    else:
        raise AssertionError("no free port for nginx in 3 tries")
    process, port = started
    try:
        yield port
    finally:
        stop(process)
