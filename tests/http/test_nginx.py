"""figtank's HTTP listener behind nginx (Debian's package), configured by the shipped
``deploy/nginx/figtank.conf``: curl's produce and fetch, Server-Sent Events delivered as
they happen and resumed by ``Last-Event-ID``, WebSocket upgrades, same-origin pages, a
client that goes away or reads nothing ending figtank's stream, and the headers nginx
sends figtank."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
import wsproto.events as ws
from structlog.testing import capture_logs

from gateway.core.config import Settings
from tests.http.helpers import H11Client, http_server, sse_events
from tests.http.nginx import SHIPPED, nginx_in_front, nginx_version
from tests.http.test_curl import curl
from tests.http.ws_client import WsClient
from tests.listeners import RunningServer

#: How soon an event published to a live stream must reach the client through nginx.
PROMPT = 1.0
#: Seconds a whole test may take.
LIMIT = 30


@asynccontextmanager
async def proxied(tmp_path: Path, edit: Callable[[str], str] | None = None, **settings: object
                  ) -> AsyncIterator[tuple[RunningServer, str]]:
    """figtank's HTTP listener with nginx in front; yields it and nginx's base URL. The
    block fails after ``LIMIT`` seconds."""
    with trio.fail_after(LIMIT):
        async with http_server(tmp_path, **settings) as server, \
                nginx_in_front(server.port, tmp_path, edit) as port:
            yield server, f"http://127.0.0.1:{port}"


def streams(server: RunningServer, kind: str) -> float | None:
    """The server's gauge of open streams of ``kind`` (``sse``, ``websocket``)."""
    return server.metric(f'figtank_http_streams{{kind="{kind}",listener="http"}}')


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


@asynccontextmanager
async def curl_stream(url: str, *headers: str) -> AsyncIterator[trio.Process]:
    """``curl -N`` reading a stream until the block ends (then killed)."""
    args = ["curl", "-sS", "-N"]
    for header in headers:
        args += ["-H", header]
    process = await trio.lowlevel.open_process([*args, url], stdout=subprocess.PIPE)
    try:
        yield process
    finally:
        process.kill()
        with trio.fail_after(5):
            await process.wait()


async def read_until(process: trio.Process, wanted: Callable[[str], bool], timeout: float,
                     text: str = "") -> str | None:
    """``text`` and what the process printed after it once ``wanted`` holds for them, or
    None after ``timeout``."""
    assert process.stdout is not None
    with trio.move_on_after(timeout):
        while not wanted(text):
            data = await process.stdout.receive_some(65536)
            assert data, f"the stream ended: {text!r}"
            text += data.decode()
        return text
    return None


def test_the_shipped_body_limit_is_figtanks() -> None:
    [limit] = re.findall(r"^\s*client_max_body_size (\d+)m;", SHIPPED.read_text(),
                         re.MULTILINE)
    assert int(limit) * 1024 * 1024 == Settings().http_max_body_bytes
    assert nginx_version().startswith("nginx/")


async def test_curl_produces_and_fetches_through_nginx(tmp_path):
    async with proxied(tmp_path) as (server, base):
        status, body = await curl("-X", "POST", "-H", "Figtank-Key: user-1",
                                  "--data-binary", "hello", f"{base}/topics/orders")
        assert status == 200, body
        assert json.loads(body)["offsets"] == [{"partition": 0, "offset": 1}]
        batch = '{"value":"a"}\n{"key":"k","value":"b"}\n'
        status, body = await curl("-X", "POST", "-H", "Content-Type: application/x-ndjson",
                                  "--data-binary", batch, f"{base}/topics/orders")
        assert [o["offset"] for o in json.loads(body)["offsets"]] == [2, 3]
        # A page served through the proxy posts with the proxy's own origin: same origin.
        status, body = await curl("-X", "POST", "-H", f"Origin: {base}", "--data-binary",
                                  "from the page", f"{base}/topics/orders")
        assert status == 200, body
        assert json.loads(body)["offsets"] == [{"partition": 0, "offset": 4}]

        status, body = await curl(f"{base}/topics/orders/partitions/0/messages?offset=1")
        assert status == 200, body
        got = json.loads(body)
        assert [(m["offset"], m.get("key"), m["value"]) for m in got["messages"]] == [
            (1, "user-1", "hello"), (2, None, "a"), (3, "k", "b"), (4, None, "from the page")]
        assert got["next_offset"] == 5

        # A long poll waits through the proxy for the next message.
        async with trio.open_nursery() as nursery:
            async def publish_later() -> None:
                await trio.sleep(0.3)
                await curl("-X", "POST", "--data-binary", "later", f"{base}/topics/orders")

            nursery.start_soon(publish_later)
            status, body = await curl(f"{base}/topics/orders/partitions/0/messages?offset=5"
                                      "&wait_ms=10000")
        assert [m["value"] for m in json.loads(body)["messages"]] == ["later"]

        # The body limit is figtank's: at it, appended; one byte over, refused by nginx.
        limit = server.settings.http_max_body_bytes
        (tmp_path / "limit").write_bytes(b"x" * limit)
        (tmp_path / "over").write_bytes(b"x" * (limit + 1))
        status, body = await curl("-X", "POST", "--data-binary", f"@{tmp_path / 'limit'}",
                                  f"{base}/topics/big")
        assert status == 200, body
        status, _ = await curl("-X", "POST", "--data-binary", f"@{tmp_path / 'over'}",
                               f"{base}/topics/big")
        assert status == 413
        status, body = await curl(f"{base}/topics/big")
        assert json.loads(body)["partitions"][0]["messages"] == 1


def http10(config: str) -> str:
    """HTTP/1.0 to figtank (nginx's default): the answer is not chunked and ends with the
    connection, so buffered nginx has nothing to tell it when to pass data on."""
    assert config.count("proxy_http_version 1.1;") == 1
    return config.replace("proxy_http_version 1.1;", "proxy_http_version 1.0;")


def header_only(config: str) -> str:
    """HTTP/1.0, and the events location's ``proxy_buffering off`` removed."""
    assert config.count("proxy_buffering off;") == 1
    return http10(config).replace("proxy_buffering off;", "")


def ignoring_the_header(config: str) -> str:
    """HTTP/1.0, and figtank's ``X-Accel-Buffering: no`` ignored."""
    assert config.count("proxy_cache off;") == 1
    return http10(config).replace(
        "proxy_cache off;", "proxy_cache off; proxy_ignore_headers X-Accel-Buffering;")


def buffered(config: str) -> str:
    """HTTP/1.0 with neither the location's setting nor figtank's header."""
    return ignoring_the_header(config).replace("proxy_buffering off;", "")


@pytest.mark.parametrize(("edit", "prompt"), [
    (None, True),
    # Either of the two is enough on its own ...
    (header_only, True),
    (ignoring_the_header, True),
    # ... and without both, nginx holds the event: what makes the others pass.
    (buffered, False),
], ids=["shipped", "header-only", "location-only", "buffered"])
async def test_an_event_reaches_the_client_through_nginx_at_once(tmp_path, edit, prompt):
    async with proxied(tmp_path, edit, http_heartbeat_secs=30.0) as (server, base):
        await curl("-X", "POST", "--data-binary", "before", f"{base}/topics/feed")
        async with curl_stream(f"{base}/topics/feed/events") as stream:
            await until(lambda: streams(server, "sse") == 1)
            await curl("-X", "POST", "--data-binary", "live", f"{base}/topics/feed")
            started = trio.current_time()
            got = await read_until(stream, lambda text: bool(sse_events(text)), PROMPT)
            if not prompt:
                assert got is None, got
                return
            assert got is not None, f"no event within {PROMPT} s"
            assert trio.current_time() - started < PROMPT
            [event] = sse_events(got)
            assert event["id"] == "2" and json.loads(event["data"])["value"] == "live"


async def test_last_event_id_resumes_through_nginx_exactly_once(tmp_path):
    async with proxied(tmp_path, http_heartbeat_secs=30.0) as (_server, base):
        for i in range(1, 6):
            await curl("-X", "POST", "--data-binary", f"m{i}", f"{base}/topics/feed")
        # What an EventSource does after a drop: the last id it saw, in the header.
        async with curl_stream(f"{base}/topics/feed/events", "Last-Event-ID: 3") as stream:
            got = await read_until(stream, lambda text: len(sse_events(text)) >= 2, 5)
            assert got is not None
            await curl("-X", "POST", "--data-binary", "m6", f"{base}/topics/feed")
            got = await read_until(stream, lambda text: len(sse_events(text)) >= 3, 5, got)
            assert got is not None
            events = sse_events(got)
            assert [e["id"] for e in events] == ["4", "5", "6"]
            assert [json.loads(e["data"])["value"] for e in events] == ["m4", "m5", "m6"]
        # The client drops; a message comes meanwhile; it comes back with its last id.
        await curl("-X", "POST", "--data-binary", "m7", f"{base}/topics/feed")
        status, body = await curl("-N", "--max-time", "1", "-H",
                                  f"Last-Event-ID: {events[-1]['id']}",
                                  f"{base}/topics/feed/events")
        assert status == 200
        assert body.startswith("retry: 1000")
        assert [(e["id"], json.loads(e["data"])["value"]) for e in sse_events(body)] == [
            ("7", "m7")]


async def test_a_client_going_away_through_nginx_ends_figtanks_stream(tmp_path):
    async with proxied(tmp_path, http_heartbeat_secs=0.5) as (server, base):
        async with curl_stream(f"{base}/topics/feed/events"):
            await until(lambda: streams(server, "sse") == 1)
        # curl is gone: nginx closes its connection to figtank, whose stream ends when
        # it next writes (an event or a heartbeat: within http.heartbeat_secs).
        await until(lambda: streams(server, "sse") == 0, timeout=3)

        client = await ws_connect(base)
        await client.next()
        await until(lambda: streams(server, "websocket") == 1)
        await client.aclose()
        await until(lambda: streams(server, "websocket") == 0, timeout=5)


async def ws_connect(base: str, origin: str | None = None) -> WsClient:
    """A WebSocket to ``base``'s ``/ws`` (the upgrade as a browser at ``origin`` sends
    it); ConnectionRefusedError with the status of a refused upgrade."""
    host_port = base.split("://", 1)[1]
    host, port = host_port.split(":")
    client = WsClient(await trio.open_tcp_stream(host, int(port)))
    headers = [(b"origin", origin.encode())] if origin else []
    await client.stream.send_all(client.conn.send(ws.Request(
        host=host_port, target="/ws", extra_headers=headers)))
    accepted = False
    with trio.fail_after(5):
        while not accepted:
            await client._receive()
            # Every event of what came: the first message may come in the same read as
            # the 101 (nginx passes them on together), and WsClient.next() reads the
            # socket before it looks for events already received.
            for event in client.conn.events():
                if isinstance(event, ws.AcceptConnection):
                    accepted = True
                elif isinstance(event, ws.RejectConnection):
                    await client.aclose()
                    raise ConnectionRefusedError(event.status_code)
                elif isinstance(event, ws.TextMessage):
                    assert event.message_finished  # the hello is small
                    client.messages.append(json.loads(event.data))
    return client


async def test_websocket_through_nginx(tmp_path):
    async with proxied(tmp_path) as (_server, base):
        # A page served through the proxy opens its WebSocket with the proxy's origin.
        client = await ws_connect(base, origin=base)
        hello = await client.next()
        assert hello["op"] == "hello"
        await client.send({"op": "publish", "topic": "chat", "value": "m1", "id": 1})
        ack = await client.until("ack")
        assert (ack["id"], ack["offset"]) == (1, 1)
        await client.send({"op": "attach", "topic": "chat", "from": "earliest"})
        assert (await client.until("attached"))["offset"] == 0
        data = await client.next()
        assert (data["op"], data["offset"], data["value"]) == ("data", 1, "m1")
        # A message produced over HTTP (through nginx too) comes down the socket live.
        await curl("-X", "POST", "--data-binary", "m2", f"{base}/topics/chat")
        data = await client.next(timeout=PROMPT)
        assert (data["offset"], data["value"]) == (2, "m2")
        await client.send({"op": "ping", "ts": 7})
        assert await client.until("pong") == {"op": "pong", "ts": 7}
        await client.aclose()

        # The Origin goes through: another site's page is still refused.
        with pytest.raises(ConnectionRefusedError) as refused:
            await ws_connect(base, origin="http://elsewhere.example")
        assert refused.value.args == (403,)


async def test_what_nginx_tells_figtank(tmp_path):
    """The headers the shipped file sets, as an upstream of the test's own receives them."""
    heads: list[dict[str, str]] = []

    async def answer(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        lines = data.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        heads.append({"request": lines[0]} | {
            name.lower(): value.strip() for name, _, value in
            (line.partition(":") for line in lines[1:])})
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n"
                              b"connection: close\r\n\r\nok")
        await stream.aclose()

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
            upstream_port = listener.socket.getsockname()[1]
            async with nginx_in_front(upstream_port, tmp_path) as port:
                base = f"http://127.0.0.1:{port}"
                status, _ = await curl("-H", "Last-Event-ID: 0:4,1:2", "-H", f"Origin: {base}",
                                       "-H", "Authorization: Bearer t0ken",
                                       f"{base}/topics/feed/events?from=earliest")
                assert status == 200
                status, _ = await curl("-H", "Upgrade: websocket", "-H", "Connection: Upgrade",
                                       f"{base}/ws")
            nursery.cancel_scope.cancel()
    events, upgrade = heads
    assert events["request"] == "GET /topics/feed/events?from=earliest HTTP/1.1"
    assert events["host"] == events["x-forwarded-host"] == f"127.0.0.1:{port}"
    assert events["x-forwarded-for"] == "127.0.0.1"
    assert events["x-forwarded-proto"] == "http"
    assert events["last-event-id"] == "0:4,1:2"
    assert events["origin"] == base and events["authorization"] == "Bearer t0ken"
    assert "connection" not in events and "upgrade" not in events
    assert upgrade["request"] == "GET /ws HTTP/1.1"
    assert upgrade["connection"] == "upgrade" and upgrade["upgrade"] == "websocket"


def test_the_docs_show_the_shipped_file() -> None:
    """Every line of the nginx block in docs/deployment.md is a line of the shipped file."""
    docs = (SHIPPED.parents[2] / "docs" / "deployment.md").read_text()
    [block] = re.findall(r"```nginx\n(.*?)```", docs, re.DOTALL)
    shipped = {line.strip() for line in SHIPPED.read_text().splitlines()}
    assert [line for line in block.splitlines() if line.strip() not in shipped] == []


async def test_a_client_that_reads_nothing_is_figtanks_slow_subscriber(tmp_path):
    """Unbuffered, nginx stops reading when its client does, so figtank sees the stall and
    ends the stream (``slow``), as it would without nginx. (Buffering, nginx would read
    the stream on into a temporary file for it: tried by hand, the stream stayed open.)"""
    async with proxied(tmp_path, idle_timeout_secs=0.5) as (server, base):
        port = int(base.rsplit(":", 1)[1])
        reader = trio.socket.socket()
        reader.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
        await reader.connect(("127.0.0.1", port))
        await reader.send(b"GET /topics/big/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        producer = await H11Client.connect(server.host, server.port)
        value = b"x" * (512 * 1024)
        with capture_logs() as logs, trio.fail_after(30):
            await producer.request("POST", "/topics/big", value)
            await until(lambda: streams(server, "sse") == 1)
            # Every socket buffer on the way fills first: figtank's, nginx's two (which
            # the kernel grows, here to some 28 MiB in all), the client's.
            for _ in range(128):
                status, _, _ = await producer.request("POST", "/topics/big", value)
                assert status == 200
                if streams(server, "sse") == 0:
                    break
        await producer.aclose()
        reader.close()
        assert streams(server, "sse") == 0
        # Its socket took nothing for idle_timeout_secs, or it fell too far behind.
        assert [e["kind"] for e in logs if e["event"] == "connection_closed"
                and e["kind"] == "slow"] == ["slow"]
