"""The HTTP edge over the other backends: produce, fetch and SSE (with a Last-Event-ID
resume) through a bridge in front of a Tank broker (another figtank's Tank listener), and
through a gateway in upstream-Kafka mode (a ``figtank serve --upstream-kafka`` process in
front of another one's Kafka listener). In bridge mode a produce's offsets are placed by
the gateway (gateway/backend/placed.py): they must be the offsets the messages got, also
while a Tank client appends to the same partition straight to the broker."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from gateway.client.tank import open_tank_client
from tests.bridge.helpers import address, bridge_server, upstream_server
from tests.http.helpers import H11Client, sse_events
from tests.http.ws_client import WsClient
from tests.upstream_kafka.helpers import upstream_and_gateway


async def read_events(client: H11Client, want: int, timeout: float = 15) -> list[dict]:
    text = ""
    with trio.fail_after(timeout):
        while len(sse_events(text)) < want:
            text += (await client.next_event()).data.decode()
    return sse_events(text)


async def produce_fetch_and_resume(host: str, port: int, topic: str) -> None:
    """Produce (one message, then an NDJSON batch), fetch, and an SSE stream resumed with
    Last-Event-ID: every offset as answered, each message once."""
    client = await H11Client.connect(host, port)
    status, _, body = await client.request("POST", f"/topics/{topic}", b"first")
    assert status == 200, body
    assert body["offsets"] == [{"partition": 0, "offset": 1}]
    batch = b"".join(json.dumps({"value": f"m{i}"}).encode() + b"\n" for i in range(4))
    status, _, body = await client.request("POST", f"/topics/{topic}", batch,
                                           [("content-type", "application/x-ndjson")])
    assert status == 200, body
    assert [o["offset"] for o in body["offsets"]] == [2, 3, 4, 5]
    status, _, body = await client.request(
        "GET", f"/topics/{topic}/partitions/0/messages?offset=2&max_count=2")
    assert status == 200, body
    assert [(m["offset"], m["value"]) for m in body["messages"]] == [(2, "m0"), (3, "m1")]
    assert body["next_offset"] == 4 and body["last_offset"] == 5

    stream = await H11Client.connect(host, port)
    await stream.send("GET", f"/topics/{topic}/events?from=earliest")
    assert (await stream.next_event()).status_code == 200
    first = await read_events(stream, 3)
    await stream.aclose()
    assert [e["id"] for e in first[:3]] == ["1", "2", "3"]  # (more may have come)
    status, _, _ = await client.request("POST", f"/topics/{topic}", b"after")
    assert status == 200
    again = await H11Client.connect(host, port)
    await again.send("GET", f"/topics/{topic}/events", headers=[("last-event-id", "3")])
    assert (await again.next_event()).status_code == 200
    rest = await read_events(again, 3)
    assert [(e["id"], json.loads(e["data"])["value"]) for e in rest[:3]] == [
        ("4", "m2"), ("5", "m3"), ("6", "after")]
    await again.aclose()
    await client.aclose()


async def websocket_acks(host: str, port: int, topic: str) -> list[int]:
    """Publish three messages over a WebSocket; the offsets of their acks."""
    ws = await WsClient.connect(host, port)
    for i in range(3):
        await ws.send({"op": "publish", "topic": topic, "value": f"ws{i}", "id": i})
    acks = [await ws.until("ack") for _ in range(3)]
    await ws.aclose()
    assert [a["id"] for a in acks] == [0, 1, 2]
    return [a["offset"] for a in acks]


async def test_http_through_a_bridge_in_front_of_a_tank_broker(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank), http_listen="127.0.0.1:0") as bridge:
            assert bridge.http is not None
            await produce_fetch_and_resume(*bridge.http, "bridged")
            assert await websocket_acks(*bridge.http, "bridged") == [7, 8, 9]


async def test_bridge_offsets_are_right_while_others_append_to_the_broker(
        tmp_path: Path) -> None:
    """HTTP producers through the bridge race a Tank producer writing straight to the
    broker: each offset answered holds the message that was sent."""
    with trio.fail_after(60):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank), http_listen="127.0.0.1:0") as bridge:
            assert bridge.http is not None and up.tank is not None
            answered: dict[int, str] = {}

            async def http_producer(name: str) -> None:
                client = await H11Client.connect(*bridge.http)
                for i in range(15):
                    value = f"{name}-{i}"
                    status, _, body = await client.request("POST", "/topics/race",
                                                           value.encode())
                    assert status == 200, body
                    [placed] = body["offsets"]
                    answered[placed["offset"]] = value
                await client.aclose()

            async def direct_producer() -> None:
                async with open_tank_client(*up.tank) as tank:
                    for i in range(30):
                        await tank.produce({("race", 0): [b"direct-%d" % i]})
                        await trio.sleep(0.002)

            client = await H11Client.connect(*bridge.http)
            status, _, _ = await client.request("POST", "/topics/race", b"create")
            assert status == 200
            async with trio.open_nursery() as nursery:
                nursery.start_soon(direct_producer)
                for name in ("a", "b", "c"):
                    nursery.start_soon(http_producer, name)
            assert len(answered) == 45  # every HTTP message has an offset of its own
            stored: dict[int, str] = {}
            offset = 1
            while True:
                status, _, body = await client.request(
                    "GET", f"/topics/race/partitions/0/messages?offset={offset}")
                stored.update((m["offset"], m["value"]) for m in body["messages"])
                if body["next_offset"] > body["last_offset"]:
                    break
                offset = body["next_offset"]
            assert len(stored) == 1 + 45 + 30  # nothing lost, nothing twice, no gap
            assert sorted(stored) == list(range(1, 77))
            for placed, value in answered.items():
                assert stored[placed] == value
            # The producers did race: direct appends landed between the HTTP ones.
            direct = [o for o, v in stored.items() if v.startswith("direct-")]
            assert any(min(direct) < o < max(direct) for o in answered)
            await client.aclose()


async def test_http_through_a_gateway_in_upstream_kafka_mode(tmp_path: Path) -> None:
    async with upstream_and_gateway(tmp_path, "--http-listen", "127.0.0.1:0") as (
            upstream, _, served):
        with trio.fail_after(60):
            assert served.http is not None
            await produce_fetch_and_resume(*served.http, "kafkaed")
            assert await websocket_acks(*served.http, "kafkaed") == [7, 8, 9]
            # What the HTTP produce answered is what the upstream stored.
            assert await upstream.stored("kafkaed") == list(enumerate(
                [b"first", b"m0", b"m1", b"m2", b"m3", b"after", b"ws0", b"ws1", b"ws2"], 1))
