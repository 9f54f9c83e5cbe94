"""A subscriber that stops reading is closed with its position, the server keeps nothing
for it, and it resumes from that position with no gap and no duplicate."""

from __future__ import annotations

import json
import socket

import h11
import trio

from tests.http.helpers import H11Client, http_server, sse_events
from tests.http.ws_client import WsClient

MESSAGES = 600
PAYLOAD = "x" * 1000


async def _publish(server, count: int, start: int = 0) -> None:
    producer = await H11Client.connect(server.host, server.port)
    batch = "".join(json.dumps({"value": f"{i}:{PAYLOAD}"}) + "\n"
                    for i in range(start, start + count))
    status, _, _ = await producer.request("POST", "/topics/flood", batch.encode(),
                                          [("content-type", "application/x-ndjson")])
    assert status == 200
    await producer.aclose()


async def _closed_as_slow(server) -> None:
    """Wait until the server closed a subscriber for being behind or taking nothing."""
    with trio.fail_after(20):
        while not any(server.metric(f'figtank_limit_hits_total{{limit="{limit}"}}')
                      for limit in ("http_subscriber_buffer_bytes", "idle_timeout_secs")):
            await trio.sleep(0.05)


async def test_a_slow_sse_subscriber_is_closed_and_resumes_exactly_once(tmp_path):
    async with http_server(tmp_path, http_subscriber_buffer_bytes=64 * 1024,
                           http_tail_buffer_bytes=256 * 1024, idle_timeout_secs=1) as server:
        await _publish(server, 1)
        stream = await trio.open_tcp_stream(server.host, server.port)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow = H11Client(stream)
        await slow.send("GET", "/topics/flood/events?from=earliest")
        await slow.next_event()  # the head: then it stops reading
        for chunk in range(5):
            await _publish(server, MESSAGES // 5, 1 + chunk * (MESSAGES // 5))
        await _closed_as_slow(server)
        tail = server.listener.tails.get("flood", 0)
        assert tail is not None
        assert tail._bytes <= 256 * 1024 + 2048  # the shared buffer stays bounded
        text = ""
        with trio.fail_after(10):  # what reached the socket before the close
            while True:
                try:
                    event = await slow.next_event()
                except h11.RemoteProtocolError:  # cut in the middle of a chunk
                    break
                if not hasattr(event, "data"):
                    break
                text += event.data.decode()
        first = sse_events(text)
        assert 0 < len(first) < MESSAGES + 1
        again = await H11Client.connect(server.host, server.port)
        await again.send("GET", "/topics/flood/events",
                         headers=[("last-event-id", first[-1]["id"])])
        await again.next_event()
        rest_text = ""
        with trio.fail_after(20):
            while len(first) + len(sse_events(rest_text)) < MESSAGES + 1:
                rest_text += (await again.next_event()).data.decode()
        offsets = [int(e["id"]) for e in first + sse_events(rest_text)]
        assert offsets == list(range(1, MESSAGES + 2))
        await again.aclose()


async def test_a_slow_websocket_subscriber_is_closed_with_its_position(tmp_path):
    async with http_server(tmp_path, http_subscriber_buffer_bytes=64 * 1024,
                           http_tail_buffer_bytes=256 * 1024, idle_timeout_secs=1
                           ) as server:
        await _publish(server, 1)
        client = await WsClient.connect(server.host, server.port)
        client.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await client.next()
        await client.send({"op": "attach", "topic": "flood", "offset": 1})
        await client.until("attached")
        for chunk in range(5):
            await _publish(server, MESSAGES // 5, 1 + chunk * (MESSAGES // 5))
        await _closed_as_slow(server)
        got = []
        while (message := await client.next()) is not None:
            got.append(message["offset"])
        # The close frame (4000, with the position) follows the data the client did not
        # read; whether it gets out before the server gives up on the socket depends on
        # the socket buffers. The client resumes after the last offset it got, as
        # figtank.js does.
        code, reason = client.closed
        assert code in (4000, 1006), (code, reason)
        assert got == list(range(2, len(got) + 2))
        position = got[-1] if got else 1
        if code == 4000:
            assert f"flood/0 at offset {position}" in reason
        again = await WsClient.connect(server.host, server.port)
        await again.next()
        await again.send({"op": "attach", "topic": "flood", "offset": position})
        await again.until("attached")
        rest = [(await again.next())["offset"] for _ in range(MESSAGES + 1 - position)]
        assert rest == list(range(position + 1, MESSAGES + 2))
        await again.aclose()
