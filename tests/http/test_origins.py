"""Writes from foreign origins are refused (403 ``origin_not_allowed``, nothing appended),
whatever their content type; reads, same-origin pages, listed origins and clients that
send neither ``Origin`` nor ``Sec-Fetch-Site`` (curl, servers) are served. Raw requests
over a socket (the Host header as a browser sends it) and curl."""

from __future__ import annotations

import json

import h11
import trio

from tests.http.helpers import http_server
from tests.http.test_curl import curl

LISTED = "http://listed.example"
WS_HEADERS = [("upgrade", "websocket"), ("connection", "Upgrade"),
              ("sec-websocket-version", "13"), ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")]


async def raw(port: int, method: str, target: str, headers: list[tuple[str, str]],
              body: bytes = b"", host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection, written by hand (``Host`` as given, default
    ``127.0.0.1:PORT``): status, headers, body."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}",
             "Connection: close", *(f"{n}: {v}" for n, v in headers)]
    if method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(body)}")
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
            conn = h11.Connection(h11.CLIENT)
            # The client's h11 state as if it had sent the request (it reads the answer).
            conn.send(h11.Request(method=method, target=target,
                                  headers=[("host", "x"), *headers]))
            got_body = b""
            head = None
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.InformationalResponse | h11.Response):
                    head = event
                    if event.status_code == 101:
                        break
                elif isinstance(event, h11.Data):
                    got_body += event.data
                else:
                    assert isinstance(event, h11.EndOfMessage | h11.ConnectionClosed), event
                    break
    assert head is not None
    return head.status_code, {k.decode(): v.decode() for k, v in head.headers}, got_body


async def values(port: int, topic: str) -> list[str]:
    status, _, body = await raw(port, "GET", f"/topics/{topic}/partitions/0/messages", [])
    if status == 404:
        return []
    assert status == 200, body
    return [m["value"] for m in json.loads(body)["messages"]]


#: (headers, Host override): each a foreign page's write.
FOREIGN = [
    ([("origin", "http://elsewhere.example")], None),
    ([("origin", "null")], None),
    ([("origin", "https://127.0.0.1:{port}")], None),  # another scheme
    ([("origin", "http://127.0.0.1:1")], None),  # another port
    ([("origin", "http://localhost:{port}")], None),  # another host
    ([("origin", "http://elsewhere.example"), ("sec-fetch-site", "same-origin")], None),
    ([("sec-fetch-site", "cross-site")], None),
    ([("sec-fetch-site", "same-site")], None),
    ([("origin", "http://127.0.0.1")], "127.0.0.1:8080"),  # default port is 80, not 8080
]
#: Same origin, listed, or no browser headers at all.
ALLOWED = [
    ([], None),
    ([("origin", "http://127.0.0.1:{port}")], None),
    ([("origin", "HTTP://127.0.0.1:{port}"), ("sec-fetch-site", "same-origin")], None),
    ([("origin", "http://127.0.0.1")], "127.0.0.1:80"),  # default port on both sides
    ([("origin", "http://127.0.0.1:80")], "127.0.0.1"),
    ([("origin", LISTED), ("sec-fetch-site", "cross-site")], None),
    ([("sec-fetch-site", "same-origin")], None),
    ([("sec-fetch-site", "none")], None),
]
CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; "
                 "boundary=b", "application/x-ndjson", "application/json"]


def _fill(headers: list[tuple[str, str]], port: int) -> list[tuple[str, str]]:
    return [(n, v.replace("{port}", str(port))) for n, v in headers]


async def test_foreign_writes_are_refused_before_anything_is_appended(tmp_path):
    async with http_server(tmp_path, http_cors_origins=(LISTED,)) as server:
        port = server.port
        refused = 0
        for i, (headers, host) in enumerate(FOREIGN):
            for kind in CONTENT_TYPES:
                body = b'{"value":"foreign"}\n' if "json" in kind else b"foreign"
                status, answer_headers, answer = await raw(
                    port, "POST", "/topics/o", [*_fill(headers, port), ("content-type", kind)],
                    body, host)
                assert status == 403, (i, kind, status, answer)
                assert json.loads(answer)["error"] == "origin_not_allowed"
                assert "access-control-allow-origin" not in answer_headers
                refused += 1
            # Before routing: a path that does not exist and another method too.
            for method, target in (("POST", "/nowhere"), ("PUT", "/topics/o"),
                                   ("DELETE", "/topics/o")):
                status, _, answer = await raw(port, method, target, _fill(headers, port),
                                              b"x", host)
                assert status == 403 and b"origin_not_allowed" in answer, (i, method)
                refused += 1
        assert await values(port, "o") == []
        for i, (headers, host) in enumerate(ALLOWED):
            status, answer_headers, answer = await raw(
                port, "POST", "/topics/o", _fill(headers, port), f"ok{i}".encode(), host)
            assert status == 200, (i, answer)
            listed = dict(headers).get("origin") == LISTED
            assert ("access-control-allow-origin" in answer_headers) == listed
        assert await values(port, "o") == [f"ok{i}" for i in range(len(ALLOWED))]
        # Reads from a foreign page are answered (the browser keeps them from the page).
        status, answer_headers, _ = await raw(port, "GET", "/topics/o/partitions/0/messages",
                                              [("origin", "http://elsewhere.example"),
                                               ("sec-fetch-site", "cross-site")])
        assert status == 200 and "access-control-allow-origin" not in answer_headers
        assert server.metric('figtank_requests_total{protocol="http",'
                             'result="refused",type="origin_not_allowed"}') == refused


async def test_any_origin_allowed_with_a_star(tmp_path):
    async with http_server(tmp_path, http_cors_origins=("*",)) as server:
        for headers in ([("origin", "http://elsewhere.example")], [("origin", "null")],
                        [("sec-fetch-site", "cross-site")]):
            status, _, answer = await raw(server.port, "POST", "/topics/s", headers, b"s")
            assert status == 200, (headers, answer)
        assert await values(server.port, "s") == ["s", "s", "s"]


async def test_websocket_upgrade_and_probe_follow_the_same_origins(tmp_path):
    async with http_server(tmp_path, http_cors_origins=(LISTED,)) as server:
        port = server.port
        for headers, host in FOREIGN:
            for upgrade in (WS_HEADERS, []):  # an upgrade, and a probe without its headers
                status, _, answer = await raw(port, "GET", "/ws",
                                              [*_fill(headers, port), *upgrade], host=host)
                assert status == 403 and b"origin_not_allowed" in answer, (headers, upgrade)
        for headers, host in ALLOWED:
            status, _, answer = await raw(port, "GET", "/ws",
                                          [*_fill(headers, port), *WS_HEADERS], host=host)
            assert status == 101, (headers, answer)
            status, _, answer = await raw(port, "GET", "/ws", _fill(headers, port), host=host)
            assert status == 400 and json.loads(answer)["error"] == "bad_upgrade", headers


async def test_curl_with_a_foreign_origin_is_refused_and_without_one_appends(tmp_path):
    async with http_server(tmp_path) as server:
        base = f"http://{server.host}:{server.port}"
        status, body = await curl("-X", "POST", "-H", "Origin: http://elsewhere.example",
                                  "--data-binary", "foreign", f"{base}/topics/c")
        assert status == 403 and json.loads(body)["error"] == "origin_not_allowed"
        status, body = await curl("-X", "POST", "-H", "Sec-Fetch-Site: cross-site",
                                  "-F", "value=foreign", f"{base}/topics/c")
        assert status == 403 and json.loads(body)["error"] == "origin_not_allowed"
        status, body = await curl("-X", "POST", "-H", f"Origin: {base}",
                                  "--data-binary", "same", f"{base}/topics/c")
        assert status == 200, body
        status, body = await curl("-X", "POST", "--data-binary", "plain", f"{base}/topics/c")
        assert status == 200, body
        status, body = await curl(f"{base}/topics/c/partitions/0/messages")
        assert [m["value"] for m in json.loads(body)["messages"]] == ["same", "plain"]
