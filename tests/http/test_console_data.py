"""What the console reads, over raw h11 and curl: ``/api/overview``'s counters move while
a producer runs with nothing scraping ``/metrics``, and the fetch endpoint's ``time=``
starts at the first message at or after a time, over the embedded store, a bridge to a
Tank broker and a gateway in upstream-Kafka mode."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import trio

from tests.bridge.helpers import address, bridge_server, upstream_server
from tests.http.helpers import H11Client, http_server
from tests.http.test_curl import curl
from tests.upstream_kafka.helpers import upstream_and_gateway

NDJSON = [("content-type", "application/x-ndjson")]


async def test_overview_counters_rise_while_publishing_with_nothing_scraping(tmp_path):
    async with http_server(tmp_path) as server, trio.open_nursery() as nursery:
        assert server.settings.metrics_listen == ""  # nothing can scrape /metrics
        producer = await H11Client.connect(server.host, server.port)
        reader = await H11Client.connect(server.host, server.port)

        async def produce() -> None:
            while True:
                status, _, _ = await producer.request("POST", "/topics/busy", b"m")
                assert status == 200
                await trio.sleep(0.005)

        nursery.start_soon(produce)
        with trio.fail_after(10):
            seen = []
            for _ in range(3):
                await trio.sleep(0.3)
                status, _, body = await reader.request("GET", "/api/overview")
                assert status == 200
                [topic] = body["topics"]
                seen.append((body["published"], topic["messages_in"]))
        nursery.cancel_scope.cancel()
    assert seen[0][0] > 0
    assert seen[0] < seen[1] < seen[2]  # both the total and the topic's count rose
    assert all(total == topic for total, topic in seen)


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


async def _three_batches(client: H11Client) -> tuple[int, int]:
    """Offsets 1-3, 4-5 and 6 appended at least 20 ms apart; a time between the first two
    batches and one between the last two (milliseconds)."""
    cuts = []
    for lines in (3, 2, 1):
        if lines != 3:
            await trio.sleep(0.02)
            cuts.append(_now_ms())
            await trio.sleep(0.02)
        body = b"".join(b'{"value":"v%d"}\n' % i for i in range(lines))
        status, _, _ = await client.request("POST", "/topics/t", body, NDJSON)
        assert status == 200
    return cuts[0], cuts[1]


async def test_fetch_time_starts_at_the_first_message_at_or_after_it(tmp_path):
    async with http_server(tmp_path) as server:
        client = await H11Client.connect(server.host, server.port)
        with trio.fail_after(10):
            second, third = await _three_batches(client)

            async def offsets(query: str) -> tuple[list[int], int]:
                status, _, body = await client.request(
                    "GET", f"/topics/t/partitions/0/messages?{query}")
                assert status == 200, body
                return [m["offset"] for m in body["messages"]], body["next_offset"]

            assert await offsets(f"time={_iso(second)}") == ([4, 5, 6], 7)
            assert await offsets(f"time={_iso(third)}&max_count=5") == ([6], 7)
            assert await offsets(f"time={_iso(second)}&max_count=1") == ([4], 5)
            assert await offsets("time=2001-01-01T00:00:00Z") == ([1, 2, 3, 4, 5, 6], 7)
            assert await offsets("time=2999-01-01T00:00:00Z") == ([], 7)  # none at or after
            # A numeric zone: its + escaped, as in any query string, or left as is (a
            # space once the query is decoded).
            zoned = datetime.fromtimestamp(second / 1000, UTC).isoformat()
            assert await offsets("time=" + zoned.replace("+", "%2B")) == ([4, 5, 6], 7)
            assert await offsets("time=" + zoned) == ([4, 5, 6], 7)
            east = datetime.fromtimestamp(third / 1000, timezone(timedelta(hours=5, minutes=30)))
            assert await offsets("time=" + east.isoformat()) == ([6], 7)

            for query, message in [
                    ("time=yesterday", "time must be an ISO 8601 time, got 'yesterday'"),
                    ("time=2026-11-27T08:00:00", "a time= time needs its zone (Z or +HH:MM)"),
                    ("time=2026-11-27T08:00:00Z&offset=2", "give offset or time, not both")]:
                status, _, body = await client.request(
                    "GET", f"/topics/t/partitions/0/messages?{query}")
                assert (status, body) == (400, {"error": "bad_parameter", "message": message})
        await client.aclose()


async def test_fetch_time_with_wait_ms_past_the_end_waits_for_the_next_message(tmp_path):
    async with http_server(tmp_path) as server, trio.open_nursery() as nursery:
        client = await H11Client.connect(server.host, server.port)
        await client.request("POST", "/topics/t", b"old")
        writer = await H11Client.connect(server.host, server.port)

        async def later() -> None:
            await trio.sleep(0.3)
            await writer.request("POST", "/topics/t", b"new")

        nursery.start_soon(later)
        with trio.fail_after(10):
            now = _iso(_now_ms() + 1)
            status, _, body = await client.request(
                "GET", f"/topics/t/partitions/0/messages?time={now}&wait_ms=5000")
        assert status == 200
        assert [(m["offset"], m["value"]) for m in body["messages"]] == [(2, "new")]


async def test_curl_fetch_from_a_time(tmp_path):
    async with http_server(tmp_path) as server:
        base = f"http://{server.host}:{server.port}"
        client = await H11Client.connect(server.host, server.port)
        with trio.fail_after(20):
            second, _ = await _three_batches(client)
            zoned = datetime.fromtimestamp(second / 1000).astimezone().isoformat()
            status, body = await curl("--get", "--data-urlencode", f"time={zoned}",
                                      "-d", "format=ndjson",
                                      f"{base}/topics/t/partitions/0/messages")
            assert status == 200, body
            assert [json.loads(line)["value"] for line in body.splitlines()] == [
                "v0", "v1", "v0"]
            status, body = await curl(f"{base}/topics/t/partitions/0/messages?time=soon")
            assert status == 400
            assert json.loads(body)["error"] == "bad_parameter"
        await client.aclose()


async def time_fetch_and_rising_counters(host: str, port: int) -> None:
    """``time=`` finds the first message at or after a time, and ``/api/overview``'s
    published count moves with each batch (nothing scrapes ``/metrics``)."""
    client = await H11Client.connect(host, port)
    second, third = await _three_batches(client)
    for query, expected in [(f"time={_iso(second)}", [4, 5, 6]),
                            (f"time={_iso(third)}", [6]),
                            ("time=2999-01-01T00:00:00Z", [])]:
        status, _, body = await client.request("GET", f"/topics/t/partitions/0/messages?{query}")
        assert status == 200, body
        assert [m["offset"] for m in body["messages"]] == expected
    published = []
    for _ in range(3):
        status, _, body = await client.request("POST", "/topics/t", b"more")
        assert status == 200, body
        status, _, body = await client.request("GET", "/api/overview")
        published.append(body["published"])
    assert published == sorted(set(published)) and published[0] >= 7
    await client.aclose()


async def test_fetch_time_and_overview_through_a_bridge(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank), http_listen="127.0.0.1:0",
                              metrics_listen="") as bridge:
            assert bridge.http is not None
            await time_fetch_and_rising_counters(*bridge.http)


async def test_fetch_time_and_overview_in_upstream_kafka_mode(tmp_path: Path) -> None:
    async with upstream_and_gateway(tmp_path, "--http-listen", "127.0.0.1:0",
                                    "--metrics-listen", "") as (_, _, served):
        with trio.fail_after(60):
            assert served.http is not None
            await time_fetch_and_rising_counters(*served.http)
