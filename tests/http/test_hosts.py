"""The Host guard against DNS rebinding (gateway/http/hosts.py), with curl resolving the
attacker's name to the loopback listener (``--resolve``, as a rebound DNS answer would):
a name that could be rebound gets 421 on every route (reads, writes, SSE, the WebSocket
upgrade) with nothing appended, names that cannot be rebound and listed ones are served;
and the origin guard takes the scheme a TLS-ending proxy names in X-Forwarded-Proto."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from gateway.http.hosts import HostGuard, host_name
from tests.http.helpers import curl_i, http_server

EVIL = "rebound.example"


async def _status(url: str, *args: str) -> tuple[int, dict]:
    answer = await curl_i(url, *args)
    return answer.status, json.loads(answer.body) if answer.body.strip() else {}


async def test_a_rebound_name_is_421_everywhere_and_safe_names_are_served(tmp_path: Path
                                                                         ) -> None:
    with trio.fail_after(30):
        async with http_server(tmp_path, http_allowed_hosts=("figtank.example.com",
                                                             ".corp.example")) as server:
            port = server.port
            resolve = []
            for name in (EVIL, "figtank.example.com", "a.b.corp.example", "app.localhost"):
                resolve += ["--resolve", f"{name}:{port}:127.0.0.1"]
            evil = f"http://{EVIL}:{port}"
            for args in ((f"{evil}/topics",), (f"{evil}/topics/t/events",),
                         (f"{evil}/topics/t", "-X", "POST", "--data-binary", "x",
                          "-H", f"Origin: {evil}"),
                         (f"{evil}/ws", "-H", "Connection: Upgrade", "-H", "Upgrade: websocket",
                          "-H", "Sec-WebSocket-Version: 13", "-H",
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="),
                         (f"{evil}/topics", "-X", "OPTIONS", "-H", f"Origin: {evil}", "-H",
                          "Access-Control-Request-Method: POST")):
                status, body = await _status(args[0], *resolve, *args[1:])
                assert (status, body.get("error")) == (421, "host_not_allowed"), args
            for host in ("127.0.0.1", "localhost", "app.localhost", "figtank.example.com",
                         "a.b.corp.example"):
                base = f"http://{host}:{port}"
                status, body = await _status(f"{base}/topics/t", *resolve, "-X", "POST",
                                             "--data-binary", host, "-H", f"Origin: {base}")
                assert status == 200, (host, body)
            status, body = await _status(f"http://127.0.0.1:{port}/topics/t/partitions/0/"
                                         "messages")
            assert [m["value"] for m in body["messages"]] == [
                "127.0.0.1", "localhost", "app.localhost", "figtank.example.com",
                "a.b.corp.example"]  # and nothing of the rebound name
            # A one-label name (no public DNS name) and an IPv6 literal are not rebindable.
            for host in ("figtank", "[::1]"):
                status, _ = await _status(f"http://127.0.0.1:{port}/topics", "-H",
                                          f"Host: {host}:{port}")
                assert status == 200, host


async def test_a_tls_ending_proxy_makes_https_pages_same_origin(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with http_server(tmp_path, http_allowed_hosts=("figtank.local",)) as server:
            url = f"http://127.0.0.1:{server.port}/topics/t"
            page = ("-H", "Host: figtank.local", "-H", "Origin: https://figtank.local")
            status, body = await _status(url, "-X", "POST", "--data-binary", "x", *page)
            assert (status, body["error"]) == (403, "origin_not_allowed")
            status, _ = await _status(url, "-X", "POST", "--data-binary", "x", *page,
                                      "-H", "X-Forwarded-Proto: https")
            assert status == 200
            # The proxy's word does not make another host's page the same origin.
            status, _ = await _status(url, "-X", "POST", "--data-binary", "x", "-H",
                                      "Host: figtank.local", "-H", "Origin: https://other.local",
                                      "-H", "X-Forwarded-Proto: https")
            assert status == 403


def test_the_names_a_guard_answers_to() -> None:
    guard = HostGuard(("figtank.example.com", ".corp.example"))
    assert [host_name(h) for h in ("A.Example:80", "[::1]:8080", "10.0.0.1", "x.example.")
            ] == ["a.example", "::1", "10.0.0.1", "x.example"]
    for name in ("127.0.0.1", "::1", "10.1.2.3", "localhost", "x.localhost", "figtank",
                 "figtank.example.com", "corp.example", "a.corp.example"):
        assert guard.answers_to(name), name
    for name in ("evil.example", "figtank.example.com.evil", "xcorp.example", "localhost.evil"):
        assert not guard.answers_to(name), name
