"""The HTTP listener as people use it: curl in a subprocess against the real server."""

from __future__ import annotations

import json

import trio
from structlog.testing import capture_logs

from tests.http.helpers import http_server, sse_events


async def curl(*args: str, timeout: float = 20) -> tuple[int, str]:
    """Run curl; (HTTP status, body). ``-N --max-time`` for streams."""
    result = await trio.run_process(
        ["curl", "-sS", "-w", "\n%{http_code}", *args], capture_stdout=True,
        capture_stderr=True, check=False)
    out = result.stdout.decode()
    body, _, status = out.rpartition("\n")
    return int(status), body


async def test_curl_produces_and_fetches(tmp_path):
    async with http_server(tmp_path) as server:
        base = f"http://{server.host}:{server.port}"
        status, body = await curl("-X", "POST", "-H", "Figtank-Key: user-1",
                                  "--data-binary", "hello", f"{base}/topics/orders")
        assert status == 200, body
        assert json.loads(body) == {"topic": "orders",
                                    "offsets": [{"partition": 0, "offset": 1}]}
        batch = '{"value":"a"}\n{"value_base64":"AAH/"}\n{"key":"k","value":"c"}\n'
        status, body = await curl("-X", "POST", "-H", "Content-Type: application/x-ndjson",
                                  "--data-binary", batch, f"{base}/topics/orders")
        assert status == 200, body
        assert [o["offset"] for o in json.loads(body)["offsets"]] == [2, 3, 4]

        status, body = await curl(f"{base}/topics/orders/partitions/0/messages?offset=1")
        assert status == 200
        got = json.loads(body)
        assert [(m["offset"], m.get("key"), m.get("value"), m.get("value_base64"))
                for m in got["messages"]] == [(1, "user-1", "hello", None), (2, None, "a", None),
                                              (3, None, None, "AAH/"), (4, "k", "c", None)]
        assert got["next_offset"] == 5 and got["last_offset"] == 4

        status, body = await curl("-H", "Accept: application/x-ndjson",
                                  f"{base}/topics/orders/partitions/0/messages?offset=3"
                                  "&max_count=1")
        assert status == 200
        assert [json.loads(line)["offset"] for line in body.splitlines()] == [3]

        status, body = await curl(f"{base}/topics")
        assert json.loads(body) == {"topics": [{"name": "orders", "partitions": 1}]}
        status, body = await curl(f"{base}/topics/orders")
        assert json.loads(body)["partitions"] == [
            {"partition": 0, "first_offset": 1, "last_offset": 4, "messages": 4}]


async def test_curl_long_poll_fetch_waits_for_the_next_message(tmp_path):
    async with http_server(tmp_path) as server, trio.open_nursery() as nursery:
        base = f"http://{server.host}:{server.port}"
        await curl("-X", "POST", "--data-binary", "first", f"{base}/topics/t")

        async def publish_later() -> None:
            await trio.sleep(0.5)
            await curl("-X", "POST", "--data-binary", "second", f"{base}/topics/t")

        nursery.start_soon(publish_later)
        started = trio.current_time()
        status, body = await curl(f"{base}/topics/t/partitions/0/messages?offset=2"
                                  "&wait_ms=10000")
        assert status == 200
        assert [m["value"] for m in json.loads(body)["messages"]] == ["second"]
        assert 0.3 < trio.current_time() - started < 8


async def test_curl_sse_resumes_with_last_event_id(tmp_path):
    async with http_server(tmp_path, http_heartbeat_secs=0.2) as server:
        base = f"http://{server.host}:{server.port}"
        for i in range(5):
            await curl("-X", "POST", "--data-binary", f"m{i}", f"{base}/topics/feed")
        status, body = await curl("-N", "--max-time", "1.5",
                                  f"{base}/topics/feed/events?from=earliest")
        assert status == 200
        events = sse_events(body)
        assert [e["id"] for e in events] == ["1", "2", "3", "4", "5"]
        assert [json.loads(e["data"])["value"] for e in events] == [f"m{i}" for i in range(5)]
        assert ": heartbeat" in body

        _status, body = await curl("-N", "--max-time", "1", "-H", "Last-Event-ID: 3",
                                  f"{base}/topics/feed/events")
        assert [e["id"] for e in sse_events(body)] == ["4", "5"]
        _, body = await curl("-N", "--max-time", "1", f"{base}/topics/feed/events?from=2")
        assert [e["id"] for e in sse_events(body)] == ["2", "3", "4", "5"]


async def test_curl_bad_input_is_4xx_with_one_log_line_and_others_are_served(tmp_path):
    async with http_server(tmp_path, http_max_body_bytes=1024) as server:
        base = f"http://{server.host}:{server.port}"
        cases = [
            (("-X", "POST", "-H", "Content-Type: application/x-ndjson", "--data-binary",
              "{not json", f"{base}/topics/t"), 400, "malformed_json"),
            (("-X", "POST", "--data-binary", "x" * 5000, f"{base}/topics/t"), 413,
             "body_too_large"),
            (("-H", "Last-Event-ID: nope", f"{base}/topics/t/events"), 400,
             "bad_last_event_id"),
            # A position the partition never had: SSE agrees with fetch (416), rather than
            # starting at the end and skipping what the partition has.
            (("-H", "Last-Event-ID: 2", f"{base}/topics/t/events"), 416,
             "offset_out_of_range"),
            (("-H", "Last-Event-ID: 0:7", f"{base}/topics/t/events"), 416,
             "offset_out_of_range"),
            ((f"{base}/topics/t/events?from=3",), 416, "offset_out_of_range"),
            ((f"{base}/topics/t/partitions/0/messages?offset=3",), 416,
             "offset_out_of_range"),
            ((f"{base}/topics/t/partitions/9/messages",), 404, "unknown_partition"),
            ((f"{base}/topics/bad..name",), 400, "invalid_topic"),
            ((f"{base}/topics/t/partitions/0/messages?offset=x",), 400, "bad_parameter"),
            (("-X", "DELETE", f"{base}/topics/t"), 405, "method_not_allowed"),
        ]
        await curl("-X", "POST", "--data-binary", "ok", f"{base}/topics/t")
        for args, want_status, want_error in cases:
            with capture_logs() as logs:
                status, body = await curl(*args)
            assert status == want_status, (args, body)
            assert json.loads(body)["error"] == want_error
            refused = [e for e in logs if e["event"] == "http_request_refused"]
            assert len(refused) == 1 and refused[0]["error"] == want_error, logs
        status, body = await curl(f"{base}/topics/t/partitions/0/messages")
        assert status == 200 and json.loads(body)["messages"][0]["value"] == "ok"
        # At the end is not past it: Last-Event-ID 1 (the last message) and from=2 (the
        # next offset) wait for what comes next.
        for args in (("-H", "Last-Event-ID: 1", f"{base}/topics/t/events"),
                     (f"{base}/topics/t/events?from=2",)):
            status, body = await curl("-N", "--max-time", "1", *args)
            assert sse_events(body) == [], (args, body)



async def test_curl_over_tls_from_the_listeners_tls_settings(tmp_path, certs):
    async with http_server(tmp_path, tls_cert=str(certs.server_cert),
                           tls_key=str(certs.server_key)) as server:
        base = f"https://127.0.0.1:{server.port}"
        status, body = await curl("--cacert", str(certs.ca_pem), "-X", "POST",
                                  "--data-binary", "secret", f"{base}/topics/tls")
        assert status == 200, body
        status, body = await curl("--cacert", str(certs.ca_pem),
                                  f"{base}/topics/tls/partitions/0/messages")
        assert json.loads(body)["messages"][0]["value"] == "secret"
        status, _ = await curl(f"http://127.0.0.1:{server.port}/topics")  # plain: refused
        assert status != 200
