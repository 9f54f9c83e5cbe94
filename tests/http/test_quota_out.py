"""The bytes-out quota on the HTTP listener: fetch answers, SSE events and WebSocket data
count against the principal's ``bytes_out_per_sec`` and wait for it; nothing is dropped."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.http.access_helpers import READER, WRITER, policy
from tests.http.helpers import H11Client, SseReader, http_server
from tests.http.ws_client import WsClient

MESSAGES = 10
SIZE = 5_000
#: 100 KB/s with a 10 KB burst, for the 3 x 50 KB below.
QUOTA = """
[[quota]]
who = ["user:reader"]
bytes_out_per_sec = 100000
burst_bytes_out = 10000
"""


async def test_fetch_sse_and_websocket_wait_for_the_bytes_out_quota(tmp_path: Path) -> None:
    access = tmp_path / "access.toml"
    access.write_text(policy('["news"]') + QUOTA)
    async with http_server(tmp_path, policy_file=access) as server:
        host, port = server.host, server.port
        writer = await H11Client.connect(host, port)
        values = [f"{i}:" + "v" * SIZE for i in range(MESSAGES)]
        for value in values:
            status, _, _ = await writer.request("POST", "/topics/news", value.encode(),
                                                [("authorization", f"Bearer {WRITER}")])
            assert status == 200
        fetched: list[str] = []
        # The clock starts before the first reader connects: the SSE stream is served
        # (and spends the quota) from the moment it is open.
        started = trio.current_time()
        sse = await SseReader.open(host, port, "/topics/news/events?from=earliest"
                                   f"&access_token={READER}")
        ws = await WsClient.connect(host, port, f"/ws?access_token={READER}")
        ws_values: list[str] = []

        async def fetch_all() -> None:
            client = await H11Client.connect(host, port)
            offset = 1
            while len(fetched) < MESSAGES:
                status, _, body = await client.request(
                    "GET", f"/topics/news/partitions/0/messages?offset={offset}&max_count=2",
                    headers=[("authorization", f"Bearer {READER}")])
                assert status == 200, body
                fetched.extend(m["value"] for m in body["messages"])
                offset = body["next_offset"]
            await client.aclose()

        async def websocket_all() -> None:
            await ws.send({"op": "attach", "topic": "news", "from": "earliest"})
            while len(ws_values) < MESSAGES:
                ws_values.append((await ws.until("data"))["value"])

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetch_all)
                nursery.start_soon(websocket_all)
                nursery.start_soon(sse.read_until, lambda s: len(s.values()) == MESSAGES, 20)
        elapsed = trio.current_time() - started
        # Delayed, not dropped: every message, in order, on each.
        assert fetched == values and ws_values == values and sse.values() == values
        # A stream takes its tokens after each write and waits for the principal's debt
        # before the next, so the last write of each stream may go out unpaid: the SSE
        # stream's (up to all 50 KB at once), a fetch answer's (10 KB) and a WebSocket
        # frame's (5 KB). What is left, 150 - 65 KB past the 10 KB burst, takes 0.75 s
        # at 100 KB/s; without the quota the whole exchange takes ~0.05 s.
        assert elapsed >= 0.7
        delayed = server.metric('figtank_quota_delay_seconds_total{direction="out"}')
        assert delayed is not None and delayed > 0.5
        assert (server.metric('figtank_limit_hits_total{limit="quota"}') or 0) >= 1
        for client in (sse.client, writer):
            await client.aclose()
        await ws.aclose()
