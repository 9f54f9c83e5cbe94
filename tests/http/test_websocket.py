"""The Figg model over WebSocket: attach, publish with acks, resume by offset, ping, and
the close codes of bad input."""

from __future__ import annotations

import contextlib

import trio
import wsproto.events as ws
from structlog.testing import capture_logs

from tests.http.helpers import H11Client, http_server
from tests.http.ws_client import WsClient


async def test_publish_attach_and_resume_after_the_last_offset(tmp_path):
    async with http_server(tmp_path) as server:
        client = await WsClient.connect(server.host, server.port)
        hello = await client.next()
        assert hello["op"] == "hello" and hello["publish_window"] == 1000
        for i in range(5):
            await client.send({"op": "publish", "topic": "chat", "value": f"m{i}", "id": i})
        acks = [await client.until("ack") for _ in range(5)]
        assert [(a["id"], a["offset"]) for a in acks] == [(i, i + 1) for i in range(5)]

        await client.send({"op": "attach", "topic": "chat", "from": "earliest"})
        assert await client.next() == {"op": "attached", "topic": "chat", "partition": 0,
                                       "offset": 0}
        got = [await client.next() for _ in range(5)]
        assert [(m["op"], m["offset"], m["value"]) for m in got] == [
            ("data", i + 1, f"m{i}") for i in range(5)]
        await client.send({"op": "ping", "ts": 42})
        assert await client.until("pong") == {"op": "pong", "ts": 42}
        await client.send({"op": "detach", "topic": "chat"})
        assert (await client.until("detached"))["topic"] == "chat"
        await client.aclose()

        again = await WsClient.connect(server.host, server.port)
        await again.next()
        await again.send({"op": "publish", "topic": "chat", "value": "m5", "id": "x"})
        assert (await again.until("ack"))["offset"] == 6
        await again.send({"op": "attach", "topic": "chat", "offset": 3})  # after offset 3
        assert (await again.until("attached"))["offset"] == 3
        assert [(await again.next())["offset"] for _ in range(3)] == [4, 5, 6]
        await again.aclose()


async def test_live_messages_reach_every_subscriber_once(tmp_path):
    async with http_server(tmp_path) as server:
        subscribers = []
        for _ in range(5):
            client = await WsClient.connect(server.host, server.port)
            await client.next()
            await client.send({"op": "attach", "topic": "live"})
            await client.until("attached")
            subscribers.append(client)
        producer = H11Client(await trio.open_tcp_stream(server.host, server.port))
        for i in range(20):
            await producer.request("POST", "/topics/live", f"v{i}".encode())
        for client in subscribers:
            got = [(await client.next())["value"] for _ in range(20)]
            assert got == [f"v{i}" for i in range(20)]
            await client.aclose()


async def _closed_by(server, *messages) -> tuple[tuple[int, str], list]:
    client = await WsClient.connect(server.host, server.port)
    await client.next()
    with capture_logs() as logs:
        # The server may close before the client sent everything.
        with contextlib.suppress(trio.BrokenResourceError):
            for message in messages:
                if isinstance(message, dict):
                    await client.send(message)
                else:
                    await client.send_raw(message)
        closed = await client.wait_closed()
        await trio.sleep(0.05)
    await client.aclose()
    return closed, [e for e in logs if e["event"] == "websocket_closed"]


async def test_bad_input_closes_with_a_code_and_one_log_line(tmp_path):
    async with http_server(tmp_path, http_max_body_bytes=2048, http_ws_publish_window=3
                           ) as server:
        cases = [
            ((ws.TextMessage(data="{not json"),), 1007),
            ((ws.BytesMessage(data=b"\x00\x01"),), 1003),
            ((ws.TextMessage(data="x" * 5000),), 1009),
            (({"op": "teleport"},), 1008),
            (({"op": "attach", "topic": "../etc"},), 1008),
            (tuple({"op": "publish", "topic": "w", "value": "v", "id": i}
                   for i in range(50)), 1008),
        ]
        for messages, code in cases:
            (got_code, _), lines = await _closed_by(server, *messages)
            assert got_code == code, messages
            assert len(lines) == 1 and lines[0]["code"] == code
        # Everyone else is still served.
        client = H11Client(await trio.open_tcp_stream(server.host, server.port))
        status, _, _ = await client.request("GET", "/topics")
        assert status == 200


async def test_a_failed_upgrade_is_400(tmp_path):
    async with http_server(tmp_path) as server:
        client = H11Client(await trio.open_tcp_stream(server.host, server.port))
        with capture_logs() as logs:
            status, _, body = await client.request(
                "GET", "/ws", headers=[("upgrade", "websocket"), ("connection", "Upgrade")])
        assert status == 400 and body["error"] == "bad_upgrade"
        assert [e["event"] for e in logs].count("http_request_refused") == 1


async def test_the_javascript_client_is_served(tmp_path):
    async with http_server(tmp_path) as server:
        client = H11Client(await trio.open_tcp_stream(server.host, server.port))
        status, headers, body = await client.request("GET", "/figtank.js")
        assert status == 200 and headers["content-type"].startswith("text/javascript")
        assert b"class Figtank" in body
