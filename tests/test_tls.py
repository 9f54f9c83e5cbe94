"""TLS on the listeners (issue 16): real handshakes on loopback, certificates by trustme.

Figg and Tank over TLS with figtank's clients, mutual TLS refusing a client without a
certificate (or with one of another CA), the client's certificate subject reaching its
session, a second named listener, Tank consume over TLS returning the bytes of plain,
/metrics over TLS, the handshake timeout, reloading the certificate, and the settings'
errors.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography import x509
from structlog.testing import capture_logs

from gateway.client.figg import open_figg_client
from gateway.client.tank import TankClient, open_tank_client
from gateway.client.tls import TLSHandshakeFailed, client_context, open_stream
from gateway.core.config import ConfigError, Settings, settings_from_mapping
from gateway.server.run import ServerInfo, open_server
from gateway.serving.tls import subject_identity
from tests.tls_certs import Certs

FAST = {"ping_interval": 0.2, "backoff": lambda attempt: 0.02 * attempt}
ALICE = "CN=alice,OU=ops,O=acme"


def tls_settings(tmp_path: Path, certs: Certs, *, mutual: bool = True, **more: Any
                 ) -> Settings:
    return Settings(data_dir=tmp_path / "data", durability="os", tank_listen="127.0.0.1:0",
                    figg_listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", kafka_listen="",
                    http_listen="",
                    tls_cert=str(certs.server_cert), tls_key=str(certs.server_key),
                    tls_client_ca=str(certs.ca_pem) if mutual else "", **more)


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[ServerInfo]:
    async with open_server(settings, grace=0.2) as server:
        yield server


def alice(certs: Certs) -> dict[str, Any]:
    return {"ca": certs.ca_pem, "cert": certs.client_cert, "key": certs.client_key}


def metric(server: ServerInfo, start: str) -> float:
    for line in server.metrics_registry.render().decode().splitlines():
        if line.startswith(start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_figg_and_tank_over_mutual_tls_with_identity(tmp_path: Path, certs: Certs
                                                           ) -> None:
    with trio.fail_after(20), capture_logs() as logs:
        async with serving(tls_settings(tmp_path, certs)) as server:
            assert server.tank and server.figg and set(server.tls) == {"tank", "figg",
                                                                       "metrics"}
            async with open_figg_client(*server.figg, **alice(certs), **FAST) as figg:
                assert await figg.publish_and_wait("orders", b"over tls") == 1
                sub = await figg.subscribe("orders", from_offset=0)
                message = await sub.receive()
                assert (message.offset, message.data) == (1, b"over tls")
                [session] = server.listeners["figg"]._slots._sessions
                assert session.principal.listener == "figg"
                assert session.principal.identity == ALICE
            async with open_tank_client(*server.tank, **alice(certs)) as tank:
                await tank.produce({("orders", 0): [b"from tank"]})
                result = await tank.consume("orders", 0, 1)
                assert [m.value for m in result.messages] == [b"over tls", b"from tank"]
                [session] = server.listeners["tank"]._slots._sessions
                assert session.principal.identity == ALICE
            with trio.move_on_after(5):
                while server.listeners["tank"].active or server.listeners["figg"].active:
                    await trio.sleep(0.02)
    closed = [e for e in logs if e["event"] == "connection_closed"]
    assert {(e["listener"], e.get("identity")) for e in closed} == {("figg", ALICE),
                                                                    ("tank", ALICE)}


@pytest.mark.parametrize("who", ["no certificate", "another CA"])
async def test_mutual_tls_refuses_a_client_without_a_good_certificate(
        tmp_path: Path, certs: Certs, who: str) -> None:
    options: dict[str, Any] = {"ca": certs.ca_pem}
    if who == "another CA":
        options |= {"cert": certs.stranger_cert, "key": certs.stranger_key}
    with trio.fail_after(20), capture_logs() as logs:
        async with serving(tls_settings(tmp_path, certs)) as server:
            assert server.tank is not None
            with pytest.raises(TLSHandshakeFailed, match=r"could not connect to .*TLS"):
                async with open_tank_client(*server.tank, **options):
                    pass
            # The Figg client gives up like after a refused connection.
            async with open_figg_client(*server.figg, **options, **FAST,
                                        first_connect_attempts=2) as figg:
                with pytest.raises(ConnectionError, match="TLS"):
                    await figg.publish_and_wait("orders", b"refused")
            with trio.move_on_after(5):
                while metric(server, 'figtank_tls_handshake_failures_total{kind="refused",'
                                     'listener="figg"}') < 2:
                    await trio.sleep(0.02)
            assert metric(server, 'figtank_tls_handshake_failures_total{kind="refused",'
                                  'listener="tank"}') == 1
            assert server.backend is not None
    failed = [e for e in logs if e["event"] == "tls_handshake_failed"]
    assert failed and all(e["peer"].startswith("127.0.0.1:") and e["reason"]
                          for e in failed)
    assert {e["listener"] for e in failed} == {"tank", "figg"}
    assert not [e for e in logs if e["event"] == "connection_closed"]


async def test_a_named_listener_serves_with_its_own_name(tmp_path: Path, certs: Certs
                                                        ) -> None:
    settings = settings_from_mapping({
        "store": {"data_dir": str(tmp_path / "data"), "durability": "os"},
        "listen": {"tank": "127.0.0.1:0", "figg": "127.0.0.1:0", "metrics": "", "kafka": "",
                   "http": ""},
        "listeners": {"analytics": {"protocol": "tank", "address": "127.0.0.1:0"},
                      "figg2": {"protocol": "figg", "address": "127.0.0.1:0"},
                      "secure": {"protocol": "tank", "address": "127.0.0.1:0",
                                 "tls_cert": str(certs.server_cert),
                                 "tls_key": str(certs.server_key)}}})
    with trio.fail_after(20), capture_logs() as logs:
        async with serving(settings) as server:
            names = {"tank", "figg", "analytics", "figg2", "secure"}
            assert set(server.addresses) == set(server.listeners) == names
            async with open_figg_client(*server.addresses["figg2"], **FAST) as figg:
                assert await figg.publish_and_wait("f", b"second figg listener") == 1
                [session] = server.listeners["figg2"]._slots._sessions
                assert session.principal.listener == "figg2"
            async with open_tank_client(*server.addresses["analytics"]) as tank:
                await tank.produce({("t", 0): [b"x"]})
                [session] = server.listeners["analytics"]._slots._sessions
                assert session.principal.listener == "analytics"
                assert session.principal.name == "listener:analytics"
                assert metric(server, 'figtank_connections{listener="analytics",'
                                      'protocol="tank"}') == 1
            async with open_tank_client(*server.addresses["secure"], ca=certs.ca_pem) as tank:
                assert [m.value for m in (await tank.consume("t", 0, 1)).messages] == [b"x"]
                [session] = server.listeners["secure"]._slots._sessions
                assert session.principal.listener == "secure"
                assert session.principal.identity is None  # TLS without client certificates
    [serving_line] = [e for e in logs if e["event"] == "figtank_serving"]
    assert set(serving_line["listeners"]) == {"analytics", "figg2", "secure"}
    assert serving_line["listeners"]["secure"].endswith(" tls")
    assert serving_line["tls"] == ["secure"]


async def test_tank_consume_over_tls_returns_the_bytes_of_plain(tmp_path: Path,
                                                                certs: Certs) -> None:
    """A multi-MiB fetch from the segment files (no tail cache: sendfile on plain, pieces
    read and sent on TLS) is the same bytes on both."""
    settings = tls_settings(tmp_path, certs, mutual=False, tail_cache_bytes=0
                            ).with_overrides(metrics_listen="", kafka_listen="", http_listen="",
                                            figg_listen="",
        listeners={"plain": {"protocol": "tank", "address": "127.0.0.1:0", "tls": False}})
    payload = random.Random(16).randbytes(256 * 1024)  # 256 KiB a message, incompressible
    with trio.fail_after(30):
        async with serving(settings) as server:
            plain = server.addresses["plain"]
            assert "plain" not in server.tls and "tank" in server.tls
            async with open_tank_client(*plain) as tank:
                for i in range(24):  # 6 MiB
                    await tank.produce({("big", 0): [payload[i:] + payload[:i]]})
            chunks = {}
            for name, options in (("plain", {}), ("tank", {"ca": certs.ca_pem})):
                async with open_tank_client(*server.addresses[name], **options) as tank:
                    [part] = await tank.consume_raw([("big", 0, 1, 16 * 1024 * 1024)])
                    assert part is not None
                    chunks[name] = part.chunk
                    result = await tank.consume("big", 0, 1, fetch_size=16 * 1024 * 1024)
                    assert len(result.messages) == 24
            assert len(chunks["plain"]) > 6 * 1024 * 1024
            assert chunks["tank"] == chunks["plain"]


async def test_metrics_over_tls(tmp_path: Path, certs: Certs) -> None:
    settings = tls_settings(tmp_path, certs, mutual=False, http_max_connections=2)
    with trio.fail_after(20):
        async with serving(settings) as server:
            assert server.metrics is not None
            stream = await open_stream(*server.metrics, client_context(ca=certs.ca_pem))
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: figtank\r\n"
                                  b"Connection: close\r\n\r\n")
            body = b""
            while data := await stream.receive_some(65536):
                body += data
            assert body.startswith(b"HTTP/1.1 200 ")
            assert b"figtank_tls_handshake_failures_total" in body
            # Plain HTTP on the TLS port is a failed handshake, not an answer.
            raw = await trio.open_tcp_stream(*server.metrics)
            await raw.send_all(b"GET /metrics HTTP/1.1\r\nHost: figtank\r\n\r\n")
            with trio.move_on_after(5):
                answer = await raw.receive_some(65536)
            assert not answer.startswith(b"HTTP/1.1 200")
            await raw.aclose()


async def test_a_stalled_handshake_is_closed_after_its_timeout(tmp_path: Path,
                                                               certs: Certs) -> None:
    settings = tls_settings(tmp_path, certs, tls_handshake_timeout_secs=0.3)
    with trio.fail_after(20), capture_logs() as logs:
        async with serving(settings) as server:
            assert server.tank is not None
            stream = await trio.open_tcp_stream(*server.tank)
            with trio.fail_after(5):
                assert await stream.receive_some(100) == b""  # closed by the server
            await stream.aclose()
            assert metric(server, 'figtank_limit_hits_total{limit="tls_handshake_timeout_secs"}'
                          ) == 1
            assert server.listeners["tank"].active == 0
    [failed] = [e for e in logs if e["event"] == "tls_handshake_failed"]
    assert failed["kind"] == "timeout" and failed["listener"] == "tank"


async def test_reload_changes_the_certificate_of_new_connections(tmp_path: Path,
                                                                certs: Certs) -> None:
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(certs.server_cert.read_bytes())
    key.write_bytes(certs.server_key.read_bytes())
    settings = Settings(data_dir=tmp_path / "data", durability="os", figg_listen="",
                        metrics_listen="", kafka_listen="", http_listen="",
                        tank_listen="127.0.0.1:0",
                        tls_cert=str(cert), tls_key=str(key))
    new_cert, new_key = certs.issue_server("renewed")

    async def server_name(server: ServerInfo) -> str:
        assert server.tank is not None
        stream = await open_stream(*server.tank, client_context(ca=certs.ca_pem))
        assert isinstance(stream, trio.SSLStream)
        name = subject_identity(stream.getpeercert())
        await stream.aclose()
        return name or ""

    with trio.fail_after(20):
        async with serving(settings) as server, \
                open_tank_client(*server.tank, ca=certs.ca_pem) as before:
            assert (await server_name(server)).startswith("CN=figtank")
            cert.write_bytes(new_cert.read_bytes())
            key.write_bytes(new_key.read_bytes())
            assert server.reload()
            assert (await server_name(server)).startswith("CN=renewed")
            await before.produce({("t", 0): [b"still served"]})  # opened before: kept
            cert.write_bytes(b"not a certificate")
            with capture_logs() as logs:
                assert not server.reload()
            assert [e["event"] for e in logs] == ["reload_failed"]
            assert "cannot load the certificate" in logs[0]["error"]
            assert (await server_name(server)).startswith("CN=renewed")


def test_subject_identity_is_rfc4514(certs: Certs) -> None:
    der = x509.load_pem_x509_certificate(certs.client_cert.read_bytes())
    assert der.subject.rfc4514_string() == ALICE  # what the sessions above were given
    cert = {"subject": ((("organizationName", "a,b+c"),),
                        (("organizationalUnitName", " x"), ("userId", "u1")),
                        (("commonName", "#bob "),), (("emailAddress", "b@x"),))}
    assert subject_identity(cert) == r"emailAddress=b@x,CN=\#bob\ ,OU=\ x+UID=u1,O=a\,b\+c"
    assert subject_identity({}) is None


def test_tls_settings_errors(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(ConfigError, match=r"^tls.cert: a certificate without its key"):
        Settings(tls_cert="a.pem")
    with pytest.raises(ConfigError, match=r"^tls.client_ca: mutual TLS needs a certificate"):
        Settings(tls_client_ca="ca.pem")
    with pytest.raises(ConfigError, match=r"^listeners.x.protocol: expected one of"):
        settings_from_mapping({"listeners": {"x": {"protocol": "gopher", "address": "a:1"}}})
    with pytest.raises(ConfigError, match=r"^listeners.tank.address: "):
        settings_from_mapping({"listeners": {"tank": {"address": "127.0.0.1:1"}}})
    with pytest.raises(ConfigError, match=r"^listeners.x.tls_kee: unknown setting"):
        settings_from_mapping({"listeners": {"x": {"tls_kee": "k"}}})
    # TLS asked for without a certificate is an error, never a plain listener.
    for listeners in ({"tank": {"tls": True}},
                      {"secure": {"protocol": "figg", "address": "127.0.0.1:0", "tls": True}}):
        name = next(iter(listeners))
        with pytest.raises(ConfigError, match=rf"^listeners.{name}.tls: TLS asked for but "
                                              "no certificate"):
            settings_from_mapping({"listeners": listeners})


async def test_unloadable_certificate_is_a_config_error_naming_the_key(
        tmp_path: Path, certs: Certs) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("nonsense")
    settings = tls_settings(tmp_path, certs, mutual=False).with_overrides(
        listeners={"figg": {"tls_cert": str(bad), "tls_key": str(certs.server_key)}})
    with pytest.raises(ConfigError, match=r"^listeners.figg.tls_cert: cannot load the "
                                          r"certificate .*bad.pem"):
        async with serving(settings):
            pass
    settings = tls_settings(tmp_path, certs, mutual=False).with_overrides(
        tls_key=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"^tls.cert: cannot read .*nope: No such file"):
        async with serving(settings):
            pass


async def test_plain_client_on_a_tls_listener_fails_cleanly(tmp_path: Path, certs: Certs
                                                            ) -> None:
    with trio.fail_after(20):
        async with serving(tls_settings(tmp_path, certs, mutual=False)) as server:
            assert server.tank is not None
            client = TankClient(*server.tank, connect_timeout=1)
            with pytest.raises(ConnectionError):
                await client.connect()
            # And TLS to a server whose certificate is not of the CA given: verify fails.
            with pytest.raises(TLSHandshakeFailed, match="certificate verify failed"):
                async with open_tank_client(*server.tank, tls=True):
                    pass
