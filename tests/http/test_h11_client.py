"""The HTTP listener with a raw h11 client: keep-alive, streams of several partitions and
their resumption, malformed requests, the connection limit."""

from __future__ import annotations

import json

import trio
from structlog.testing import capture_logs

from tests.http.helpers import H11Client, http_server, sse_events


async def test_keep_alive_serves_many_requests_on_one_connection(tmp_path):
    async with http_server(tmp_path) as server:
        client = await H11Client.connect(server.host, server.port)
        for i in range(20):
            status, _, body = await client.request("POST", "/topics/k", f"v{i}".encode())
            assert status == 200 and body["offsets"] == [{"partition": 0, "offset": i + 1}]
        status, _, body = await client.request("GET", "/topics/k/partitions/0/messages"
                                               "?offset=5&max_count=3")
        assert [m["value"] for m in body["messages"]] == ["v4", "v5", "v6"]
        await client.aclose()


async def _read_sse(client: H11Client, want: int, timeout: float = 10) -> list[dict]:
    """Read a stream until ``want`` events came."""
    text = ""
    with trio.fail_after(timeout):
        while len(sse_events(text)) < want:
            event = await client.next_event()
            text += event.data.decode()
    return sse_events(text)


async def test_sse_of_all_partitions_resumes_every_partition_exactly_once(tmp_path):
    async with http_server(tmp_path, default_partitions=3) as server:
        producer = await H11Client.connect(server.host, server.port)
        for i in range(9):
            status, _, _ = await producer.request("POST", f"/topics/multi?partition={i % 3}",
                                                  f"{i % 3}-{i // 3}".encode())
            assert status == 200
        reader = await H11Client.connect(server.host, server.port)
        await reader.send("GET", "/topics/multi/events?from=earliest")
        head = await reader.next_event()
        assert head.status_code == 200
        assert dict(head.headers)[b"content-type"].startswith(b"text/event-stream")
        first = await _read_sse(reader, 5)
        await reader.aclose()
        last_id = first[4]["id"]
        # Every partition's position is in the id.
        assert sorted(part.split(":")[0] for part in last_id.split(",")) == ["0", "1", "2"]
        seen = [json.loads(e["data"]) for e in first[:5]]

        for i in range(9, 12):
            await producer.request("POST", f"/topics/multi?partition={i % 3}",
                                   f"{i % 3}-{i // 3}".encode())
        again = await H11Client.connect(server.host, server.port)
        await again.send("GET", "/topics/multi/events", headers=[("last-event-id", last_id)])
        await again.next_event()
        rest = await _read_sse(again, 12 - 5)
        seen += [json.loads(e["data"]) for e in rest]
        by_partition: dict[int, list[int]] = {}
        for message in seen:
            by_partition.setdefault(message["partition"], []).append(message["offset"])
        assert by_partition == {0: [1, 2, 3, 4], 1: [1, 2, 3, 4], 2: [1, 2, 3, 4]}
        await again.aclose()
        await producer.aclose()


async def test_a_malformed_request_is_400_and_the_listener_serves_on(tmp_path):
    async with http_server(tmp_path) as server:
        stream = await trio.open_tcp_stream(server.host, server.port)
        with capture_logs() as logs:
            await stream.send_all(b"GET /topics HTTP/1.1\r\nno colon here\r\n\r\n")
            answer = b""
            with trio.fail_after(5):
                while chunk := await stream.receive_some(65536):
                    answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b'"error":"malformed_request"' in answer
        assert [e["event"] for e in logs].count("http_request_refused") == 1
        await stream.aclose()
        client = await H11Client.connect(server.host, server.port)
        status, _, body = await client.request("GET", "/topics")
        assert status == 200 and body == {"topics": []}
        await client.aclose()


async def test_connections_over_the_limit_are_closed_and_counted(tmp_path):
    async with http_server(tmp_path, max_connections=2) as server:
        held = [await H11Client.connect(server.host, server.port) for _ in range(2)]
        for client in held:  # both admitted and served
            status, _, _ = await client.request("GET", "/topics")
            assert status == 200
        extra = await trio.open_tcp_stream(server.host, server.port)
        with trio.fail_after(5):
            assert await extra.receive_some(100) == b""
        assert server.metric('figtank_limit_hits_total{limit="max_connections"}') == 1
        for client in held:
            await client.aclose()


async def test_an_idle_connection_is_closed(tmp_path):
    async with http_server(tmp_path, idle_timeout_secs=0.3) as server:
        stream = await trio.open_tcp_stream(server.host, server.port)
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""
        assert server.metric('figtank_connections_closed_total{listener="http",'
                             'protocol="http",reason="idle"}') == 1
