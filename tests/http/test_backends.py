"""The HTTP edge over the other backends: produce, fetch and SSE (with a Last-Event-ID
resume) through a bridge in front of a Tank broker (another figtank's Tank listener), and
through a gateway in upstream-Kafka mode (a ``figtank serve --upstream-kafka`` process in
front of another one's Kafka listener). In bridge mode a produce's offsets are placed by
the gateway (gateway/backend/placed.py): they must be the offsets the messages got, also
while a Tank client appends to the same partition straight to the broker.

The hardened edge (issue 34) over both: the CL.TE smuggling case refused before the
backend, writes from a foreign origin refused with nothing appended upstream, a
WebSocket's bad first message closed with its frame (the ``websockets`` library), and the
RFC 6750 challenges under an access policy (the servers run with :data:`POLICY`)."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from websockets.exceptions import InvalidStatus

from gateway.client.tank import open_tank_client
from tests.bridge.helpers import address, bridge_server, upstream_server
from tests.http.helpers import H11Client, curl_i, sse_events
from tests.http.test_smuggling import cl_te_refused_before_the_backend
from tests.http.ws_client import WsClient, websockets_close
from tests.upstream_kafka.helpers import upstream_and_gateway

WRITER = "backends-writer-token-0123"
READER = "backends-reader-token-0123"
#: Anyone may do anything, but topic "guarded": only the writer's token may publish
#: there, the reader's may subscribe, and nobody else may do either.
POLICY = f"""default = "allow"
[[token]]
user = "writer"
token = "{WRITER}"
[[token]]
user = "reader"
token = "{READER}"
[[rule]]
who = ["user:writer"]
topics = ["guarded"]
allow = ["publish", "create", "subscribe"]
[[rule]]
who = ["user:reader"]
topics = ["guarded"]
allow = ["subscribe"]
[[rule]]
who = ["*"]
topics = ["guarded"]
deny = ["publish", "create", "subscribe"]
"""


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


def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "access.toml"
    path.write_text(POLICY)
    return path


async def values(host: str, port: int, topic: str) -> list[str]:
    """Every value of the topic's partition 0, as the gateway fetches it."""
    got = await curl_i(f"http://{host}:{port}/topics/{topic}/partitions/0/messages?offset=1")
    if got.status == 404:
        return []
    assert got.status == 200, got
    return [m["value"] for m in got.json()["messages"]]


async def hardened_edge(host: str, port: int, topic: str) -> None:
    """Foreign-origin writes (curl and a ``websockets`` upgrade) refused 403
    ``origin_not_allowed``, a same-origin write appended; a WebSocket whose first message
    is bad gets its close frame (1007, 1008) and nothing it sent is appended; the bearer
    challenges on "guarded". What ``topic`` holds afterwards is one "same" only."""
    base = f"http://{host}:{port}"
    for args in (("-H", "Origin: http://elsewhere.example", "--data-binary", "foreign"),
                 ("-H", f"Origin: http://localhost:{port}", "--data-binary", "foreign"),
                 ("-H", "Sec-Fetch-Site: cross-site", "-H",
                  "Content-Type: application/x-www-form-urlencoded",
                  "--data-binary", "value=foreign")):
        answer = await curl_i(f"{base}/topics/{topic}", *args)
        assert answer.status == 403, (args, answer)
        assert answer.json()["error"] == "origin_not_allowed"
    assert await values(host, port, topic) == []
    answer = await curl_i(f"{base}/topics/{topic}", "-H", f"Origin: {base}",
                        "-H", "Sec-Fetch-Site: same-origin", "--data-binary", "same")
    assert answer.status == 200, answer
    assert answer.json()["offsets"] == [{"partition": 0, "offset": 1}]

    url = f"ws://{host}:{port}/ws"
    try:
        await trio.to_thread.run_sync(lambda: websockets_close(
            url, json.dumps({"op": "publish", "topic": topic, "value": "foreign"}),
            origin="http://elsewhere.example"))
        raise AssertionError("a foreign page's WebSocket was let in")
    except InvalidStatus as exc:
        assert exc.response.status_code == 403
        assert b"origin_not_allowed" in exc.response.body
    for sent, code in ((("{not json",), 1007),
                       ((json.dumps({"op": "publish", "topic": topic, "value": 5}),), 1008),
                       (('{"op": "nope"}',), 1008)):
        got_code, reason, got = await trio.to_thread.run_sync(
            lambda sent=sent: websockets_close(url, *sent, origin=base))
        assert got_code == code and reason, (sent, got_code, reason)
        assert [m["op"] for m in got] == ["hello"]
    assert await values(host, port, topic) == ["same"]

    # RFC 6750 challenges: the policy's decision is the gateway's, whatever the backend.
    target = f"{base}/topics/guarded"
    answer = await curl_i(target, "--data-binary", "anonymous")
    assert answer.status == 401 and answer.headers["www-authenticate"] == \
        'Bearer realm="figtank"', answer
    answer = await curl_i(target, "-H", "Authorization: Bearer not-a-token",
                        "--data-binary", "bad")
    assert answer.status == 401 and answer.json()["error"] == "invalid_token", answer
    assert 'error="invalid_token"' in answer.headers["www-authenticate"]
    answer = await curl_i(target, "-H", f"Authorization: Bearer {READER}",
                        "--data-binary", "reader")
    assert answer.status == 403 and answer.json()["error"] == "access_denied", answer
    assert 'error="insufficient_scope"' in answer.headers["www-authenticate"]
    answer = await curl_i(target, "-H", f"Authorization: Bearer {WRITER}",
                        "--data-binary", "writer")
    assert answer.status == 200, answer
    answer = await curl_i(f"{target}/partitions/0/messages?offset=1",
                        "-H", f"Authorization: Bearer {READER}")
    assert [m["value"] for m in answer.json()["messages"]] == ["writer"]


async def test_http_through_a_bridge_in_front_of_a_tank_broker(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with upstream_server(tmp_path / "up") as up, \
                bridge_server(address(up.tank), http_listen="127.0.0.1:0",
                              policy_file=policy_file(tmp_path)) as bridge:
            assert bridge.http is not None
            await produce_fetch_and_resume(*bridge.http, "bridged")
            assert await websocket_acks(*bridge.http, "bridged") == [7, 8, 9]
            await cl_te_refused_before_the_backend(bridge.http)
            await hardened_edge(*bridge.http, "edge")
            assert up.tank is not None
            async with open_tank_client(*up.tank) as tank:  # what the broker holds
                result = await tank.consume("edge", 0, 1)
            assert [(m.seq, m.value) for m in result.messages] == [(1, b"same")]


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
    async with upstream_and_gateway(tmp_path, "--http-listen", "127.0.0.1:0",
                                    "--policy-file", str(policy_file(tmp_path))) as (
            upstream, _, served):
        with trio.fail_after(60):
            assert served.http is not None
            await produce_fetch_and_resume(*served.http, "kafkaed")
            assert await websocket_acks(*served.http, "kafkaed") == [7, 8, 9]
            # What the HTTP produce answered is what the upstream stored.
            assert await upstream.stored("kafkaed") == list(enumerate(
                [b"first", b"m0", b"m1", b"m2", b"m3", b"after", b"ws0", b"ws1", b"ws2"], 1))
            await cl_te_refused_before_the_backend(served.http)
            assert await upstream.stored("backend-ok") == [(1, b"ok")]
            await hardened_edge(*served.http, "edge")
            assert await upstream.stored("edge") == [(1, b"same")]
            assert await upstream.stored("guarded") == [(1, b"writer")]
