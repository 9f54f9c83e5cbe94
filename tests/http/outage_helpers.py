"""One upstream outage, as every HTTP front end sees it (shared by the bridge and the
upstream-Kafka tests): with the upstream stopped, curl's produce, fetch and topic list get
503 + ``Retry-After`` promptly, a WebSocket publish and attach get their error message and
the socket stays usable, and an SSE stream and a WebSocket subscription attached before
the outage are told, then, once the upstream is back, get what was published after it,
exactly once and in order (a whole-topic SSE stream of two partitions too)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from gateway.client.tank import open_tank_client
from gateway.server.run import ServerInfo
from tests.bridge.helpers import bridge_server, free_port, upstream_server
from tests.http.helpers import SseReader, curl_i
from tests.http.ws_client import WsClient


@dataclass
class Figures:
    """How long the clients waited in the outage, in seconds."""

    produce: float = 0.0
    fetch: float = 0.0
    ws_publish: float = 0.0
    told_ws: float = 0.0
    told_sse: float = 0.0
    resumed: float = 0.0
    refusals: list[str] = field(default_factory=list)


async def produce(base: str, value: str) -> int:
    """Produce ``value`` with curl, again while the answer is 503; its offset."""
    with trio.fail_after(30):
        while True:
            answer = await curl_i(f"{base}/topics/out", "-X", "POST", "--data-binary", value)
            if answer.status == 200:
                return int(answer.json()["offsets"][0]["offset"])
            assert answer.status == 503 and answer.headers["retry-after"] == "1", answer
            await trio.sleep(0.2)


async def outage(host: str, port: int, stop: Callable[[], Awaitable[None]],
                 start: Callable[[], Awaitable[None]], tank: tuple[str, int]) -> Figures:
    """Run the outage against the HTTP listener at ``host:port`` (the upstream running
    when called; ``stop`` and ``start`` it); ``tank``: the gateway's Tank listener (to
    create a topic of two partitions, for a whole-topic SSE stream)."""
    figures = Figures()
    base = f"http://{host}:{port}"
    for i in range(1, 4):
        assert await produce(base, f"m{i}") == i
    async with open_tank_client(*tank, request_timeout=10) as client:
        await client.create_topic("two", 2)
    whole = await SseReader.open(host, port, "/topics/two/events?from=earliest")
    subscriber = await WsClient.connect(host, port)
    assert (await subscriber.next())["op"] == "hello"
    await subscriber.send({"op": "attach", "topic": "out", "from": "earliest"})
    assert (await subscriber.until("attached"))["offset"] == 0
    assert [(await subscriber.next())["offset"] for _ in range(3)] == [1, 2, 3]
    sse = await SseReader.open(host, port, "/topics/out/events?from=earliest")
    assert [(await sse.next())["id"] for _ in range(3)] == ["1", "2", "3"]
    publisher = await WsClient.connect(host, port)
    assert (await publisher.next())["op"] == "hello"

    await stop()
    stopped = trio.current_time()
    told = await subscriber.next(timeout=15)
    figures.told_ws = trio.current_time() - stopped
    assert told["op"] == "unavailable", told
    assert (told["topic"], told["partition"], told["offset"]) == ("out", 0, 3)
    assert told["message"]
    event = await sse.next()
    figures.told_sse = trio.current_time() - stopped
    assert event.get("event") == "unavailable", event
    assert json.loads(event["data"])["error"] == "unavailable"
    event = await whole.next()
    assert event.get("event") == "unavailable", event

    # HTTP: 503, Retry-After, the JSON error; promptly.
    answer = await curl_i(f"{base}/topics/out", "-X", "POST", "--data-binary", "lost?")
    assert answer.exit == 0 and answer.status == 503, answer
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["error"] == "unavailable" and answer.json()["message"]
    figures.produce = answer.seconds
    fetched = await curl_i(f"{base}/topics/out/partitions/0/messages?offset=4&wait_ms=3000")
    assert (fetched.exit, fetched.status) == (0, 503), fetched
    assert fetched.headers["retry-after"] == "1" and fetched.json()["error"] == "unavailable"
    figures.fetch = fetched.seconds
    for path in ("/topics", "/topics/out", "/api/overview"):
        listed = await curl_i(base + path)
        assert (listed.exit, listed.status) == (0, 503), (path, listed)
        assert listed.json()["error"] == "unavailable"
    new_stream = await curl_i(f"{base}/topics/out/events", "--max-time", "5")
    assert new_stream.status == 503, new_stream

    # WebSocket: an error per operation, the socket goes on.
    sent = trio.current_time()
    await publisher.send({"op": "publish", "topic": "out", "value": "lost?", "id": "p1"})
    error = await publisher.next()
    figures.ws_publish = trio.current_time() - sent
    assert {k: error[k] for k in ("op", "request", "id", "topic", "partition", "error",
                                  "retry_after_ms")} == {
        "op": "error", "request": "publish", "id": "p1", "topic": "out", "partition": 0,
        "error": "unavailable", "retry_after_ms": 1000}, error
    await publisher.send({"op": "ping", "ts": 5})
    assert await publisher.next() == {"op": "pong", "ts": 5}
    await publisher.send({"op": "attach", "topic": "out", "id": "a1"})
    error = await publisher.next()
    assert (error["op"], error["request"], error["id"], error["error"]) == (
        "error", "attach", "a1", "unavailable"), error
    assert publisher.closed is None and subscriber.closed is None

    await start()
    started = trio.current_time()
    back = await subscriber.next(timeout=30)
    assert back == {"op": "available", "topic": "out", "partition": 0, "offset": 3}, back
    event = await sse.next(timeout=30)
    assert event.get("event") == "available", event
    assert json.loads(event["data"]) == {"last_event_id": "3"}
    figures.resumed = trio.current_time() - started
    event = await whole.next(timeout=30)
    assert event.get("event") == "available", event
    assert json.loads(event["data"]) == {"last_event_id": "0:0,1:0"}

    # Every front end serves again: produce (HTTP and WebSocket), and the subscribers
    # get exactly what came after the outage, in order.
    assert await produce(base, "m4") == 4
    await publisher.send({"op": "publish", "topic": "out", "value": "m5", "id": "p2"})
    acked = await publisher.until("ack")
    assert (acked["id"], acked["offset"]) == ("p2", 5), acked
    assert await produce(base, "m6") == 6
    got = [await subscriber.next() for _ in range(3)]
    assert [(m["op"], m["offset"], m["value"]) for m in got] == [
        ("data", 4, "m4"), ("data", 5, "m5"), ("data", 6, "m6")]
    events = [await sse.next() for _ in range(3)]
    assert [(e["id"], json.loads(e["data"])["value"]) for e in events] == [
        ("4", "m4"), ("5", "m5"), ("6", "m6")]
    answer = await curl_i(f"{base}/topics/two?partition=1", "-X", "POST", "--data-binary", "w")
    assert answer.status == 200, answer
    event = await whole.next()
    assert (event["id"], json.loads(event["data"])["value"]) == ("0:0,1:1", "w"), event
    await whole.client.aclose()
    # Nothing more (no duplicate), and what is stored is what was acknowledged.
    with trio.move_on_after(0.5):
        extra = await subscriber.next(timeout=1)
        raise AssertionError(f"more than was published: {extra}")
    stored = await curl_i(f"{base}/topics/out/partitions/0/messages?offset=1")
    assert [(m["offset"], m["value"]) for m in stored.json()["messages"]] == [
        (i, f"m{i}") for i in range(1, 7)]
    await publisher.aclose()
    await subscriber.aclose()
    await sse.client.aclose()
    return figures


class RestartableBroker:
    """A Tank broker (an in-process figtank) on ``where`` with its data in ``data``, which
    :meth:`stop` takes down and :meth:`start` brings back on the same port and data; run
    it with ``await nursery.start(broker.run)``."""

    def __init__(self, data: Path, where: str) -> None:
        self.data = data
        self.where = where
        self._stopped = trio.Event()
        self._restarted = trio.Event()
        self._up_again = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with upstream_server(self.data, tank_listen=self.where):
            task_status.started()
            await self._stopped.wait()
        await self._restarted.wait()
        async with upstream_server(self.data, tank_listen=self.where):
            self._up_again.set()
            await trio.sleep_forever()

    async def stop(self) -> None:
        self._stopped.set()
        await trio.sleep(0)

    async def start(self) -> None:
        self._restarted.set()
        await self._up_again.wait()


@asynccontextmanager
async def bridge_over_a_restartable_broker(data: Path
                                           ) -> AsyncIterator[tuple[ServerInfo,
                                                                    RestartableBroker]]:
    """A bridge (its HTTP listener on) in front of a :class:`RestartableBroker` with its
    data in ``data``, on a port it can come back to; the bridge waits 1 s for it."""
    where = f"127.0.0.1:{free_port()}"
    async with trio.open_nursery() as nursery, bridge_server(
            where, http_listen="127.0.0.1:0", upstream_wait_secs=1.0) as bridge:
        assert bridge.http is not None
        broker = RestartableBroker(data, where)
        await nursery.start(broker.run)
        yield bridge, broker
        nursery.cancel_scope.cancel()

