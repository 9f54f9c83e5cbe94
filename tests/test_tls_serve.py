"""TLS in a real ``figtank serve`` (issue 16): the CLI's --tls/--ca/--cert/--key, and
SIGHUP reloading a changed certificate while a subscriber stays connected (a bad file on
reload keeps the one in force)."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.client.figg_blocking import BlockingFiggClient
from gateway.serving.tls import subject_identity
from tests.serving import ServeProcess, figtank_serve
from tests.tls_certs import Certs

pytestmark = pytest.mark.slow


def figtank(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def addr(address: tuple[str, int] | None) -> str:
    assert address is not None
    return f"{address[0]}:{address[1]}"


def serve_mutual_tls(tmp_path: Path, certs: Certs) -> tuple[Path, Path, list[str]]:
    """Copies of the server's certificate and key (to be changed), and the flags."""
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(certs.server_cert.read_bytes())
    key.write_bytes(certs.server_key.read_bytes())
    return cert, key, ["--data-dir", str(tmp_path / "data"), "--durability", "os",
                       "--tank-listen", "127.0.0.1:0", "--figg-listen", "127.0.0.1:0",
                       "--metrics-listen", "", "--tls-cert", str(cert), "--tls-key", str(key),
                       "--tls-client-ca", str(certs.ca_pem)]


def server_subject(address: tuple[str, int] | None, certs: Certs) -> str:
    """The subject of the certificate a new connection to ``address`` is shown."""
    assert address is not None
    context = ssl.create_default_context(cafile=certs.ca_pem)
    context.load_cert_chain(certs.client_cert, certs.client_key)
    with socket.create_connection(address, timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=address[0]) as tls:
        return subject_identity(tls.getpeercert()) or ""


def wait_event(server: ServeProcess, name: str, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while len(server.events(name)) < count:
        assert time.monotonic() < deadline, f"no {name} line: {server.log_lines[-5:]}"
        time.sleep(0.02)


def test_cli_over_mutual_tls(tmp_path: Path, certs: Certs) -> None:
    *_, flags = serve_mutual_tls(tmp_path, certs)
    mine = ["--ca", str(certs.ca_pem), "--cert", str(certs.client_cert), "--key",
            str(certs.client_key)]
    with figtank_serve(*flags) as server:
        figg, tank = ["--figg", addr(server.figg)], ["--tank", addr(server.tank)]
        done = figtank("publish", "orders", "first", "second", *figg, *mine)
        assert done.returncode == 0, done.stderr
        # produce's --key is the message key: its TLS key is --tls-key.
        done = figtank("produce", "orders", "third", *tank, *mine[:-2], "--tls-key",
                       str(certs.client_key))
        assert done.returncode == 0, done.stderr
        done = figtank("consume", "orders", "--json", *tank, *mine)
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["value"] for line in done.stdout.splitlines()] == [
            "first", "second", "third"]
        done = figtank("subscribe", "orders", "--from", "0", "--count", "3", *figg, *mine)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1", "first", "2", "second", "3", "third"]

        # Without a client certificate: refused in the handshake, exit 1, one clear line.
        for command, where in (("consume", tank), ("publish", figg)):
            refused = figtank(command, "orders", *(["x"] if command == "publish" else []),
                              *where, "--ca", str(certs.ca_pem), "--timeout", "3")
            assert refused.returncode == 1, refused.stderr
            [line] = refused.stderr.splitlines()
            assert line.startswith(f"figtank {command}: ") and "TLS" in line, line
        # Without --ca the server's certificate is not trusted.
        untrusted = figtank("consume", "orders", *tank, "--tls", "--timeout", "3")
        assert untrusted.returncode == 1
        assert "certificate verify failed" in untrusted.stderr
        # Usage mistakes: exit 2 before anything is sent.
        missing = figtank("consume", "orders", *tank, "--ca", str(tmp_path / "nope.pem"))
        assert missing.returncode == 2
        assert missing.stderr.startswith("figtank consume: argument --ca: cannot read ")
        no_cert = figtank("consume", "orders", *tank, "--key", str(certs.client_key))
        assert (no_cert.returncode, no_cert.stderr.splitlines()[0]) == (
            2, "figtank consume: argument --key: needs --cert (see 'figtank consume --help')")
        assert server.stop() == 0
    identities = {e.get("identity") for e in server.events("connection_closed")}
    assert identities == {"CN=alice,OU=ops,O=acme"}
    assert server.events("tls_handshake_failed")


def test_sighup_reloads_the_certificate_and_keeps_connections(tmp_path: Path,
                                                              certs: Certs) -> None:
    cert, key, flags = serve_mutual_tls(tmp_path, certs)
    renewed_cert, renewed_key = certs.issue_server("renewed")
    mine = {"ca": certs.ca_pem, "cert": certs.client_cert, "key": certs.client_key}
    with figtank_serve(*flags) as server:
        assert server.figg is not None
        assert server_subject(server.tank, certs).startswith("CN=figtank")
        with BlockingFiggClient(*server.figg, **mine) as subscriber:
            sub = subscriber.subscribe("news", from_offset=0)
            subscriber.publish_and_wait("news", b"before")
            assert sub.get(timeout=5).data == b"before"

            cert.write_bytes(renewed_cert.read_bytes())
            key.write_bytes(renewed_key.read_bytes())
            os.kill(server.process.pid, signal.SIGHUP)
            wait_event(server, "reloaded", 2)  # one line per TLS listener: tank, figg
            assert server_subject(server.tank, certs).startswith("CN=renewed")
            assert server_subject(server.figg, certs).startswith("CN=renewed")

            cert.write_text("not a certificate")
            os.kill(server.process.pid, signal.SIGHUP)
            wait_event(server, "reload_failed", 2)
            assert server_subject(server.tank, certs).startswith("CN=renewed")

            # The subscriber's connection, opened before both reloads, still serves.
            done = figtank("publish", "news", "after", "--figg", addr(server.figg),
                           "--ca", str(certs.ca_pem), "--cert", str(certs.client_cert),
                           "--key", str(certs.client_key))
            assert done.returncode == 0, done.stderr
            assert sub.get(timeout=5).data == b"after"
            assert subscriber.client.connections == 1
        assert server.stop() == 0
    failed = server.events("reload_failed")
    assert all("cannot load the certificate" in e["error"] for e in failed)
