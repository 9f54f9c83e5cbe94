"""The async Figg client: window, ACKs, backoff, pings, state, resend order on reconnect."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from gateway.client.errors import ConnectError
from gateway.client.figg import (
    BadResponse,
    ClientClosed,
    ConnectionState,
    ExponentialBackoff,
    FiggClient,
    RequestRefused,
    open_figg_client,
)
from protocols.connection import Role
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import (
    Ack,
    Attach,
    Attached,
    Detach,
    Detached,
    MessageType,
    Ping,
    Publish,
)
from protocols.figg.records import encode_ack_frame
from tests.figg.helpers import RESUME, figg_server, frame
from tests.figg.memory_backend import MemoryBackend
from tests.figg.proxy import dropping_proxy, serve_local

FAST = {"backoff": lambda attempt: 0.0 if attempt == 0 else 0.02, "ping_interval": 0.5}


def test_default_backoff_matches_figg():
    mid = ExponentialBackoff(rng=lambda: 0.5)  # jitter factor 1.0
    assert [mid(a) for a in range(8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    low, high = ExponentialBackoff(rng=lambda: 0.0), ExponentialBackoff(rng=lambda: 0.9999)
    assert low(3) == pytest.approx(3.2) and 4.79 < high(3) < 4.8
    assert ExponentialBackoff()(10**6) <= 36


async def test_publish_subscribe_and_callbacks():
    with trio.fail_after(10):
        async with figg_server(MemoryBackend()) as server, \
                open_figg_client(server.host, server.port, **FAST) as client:
            acked: list[int] = []
            seqs = [await client.publish("t", b"m%d" % i, acked.append) for i in range(10)]
            assert seqs == list(range(1, 11))
            assert await client.publish_and_wait("t", b"last") == 11
            assert acked == seqs and client.unacked == 0
            sub = await client.subscribe("t", from_offset=0)
            assert sub.start_offset == 0
            got = [await sub.receive() for _ in range(11)]
            assert [m.offset for m in got] == list(range(1, 12))
            assert got[-1].data == b"last" and sub.last_offset == 11
            await sub.aclose()
            assert [m async for m in sub] == []


async def test_window_blocks_when_full():
    backend = MemoryBackend()
    with trio.fail_after(10):
        async with figg_server(backend) as server, \
                open_figg_client(server.host, server.port, window=4, **FAST) as client:
            await client.wait_connected()
            backend.produce_delay = 0.3
            for i in range(4):
                await client.publish("w", b"%d" % i)
            assert client.unacked == 4
            with trio.move_on_after(0.1) as scope:
                await client.publish("w", b"blocked")
            assert scope.cancelled_caught  # the 5th waits for window space
            backend.produce_delay = 0
            await client.publish_and_wait("w", b"after")
            assert client.unacked == 0


async def test_state_callbacks_and_reconnect_after_server_restart():
    states: list[ConnectionState] = []
    backend = MemoryBackend()
    with trio.fail_after(10):
        async with figg_server(backend) as server:
            port = server.port
        client = FiggClient("127.0.0.1", port, on_state_change=states.append,
                            backoff=lambda a: 0.02 * min(a, 1), ping_interval=0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            await trio.sleep(0.1)  # nothing listens: retries with backoff
            assert states == []
            seq = await client.publish("r", b"queued while down")
            listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
            # Serve one connection by hand: see the resent publish, ack it, hang up.
            stream = await listeners[0].accept()
            conn = FiggConnection(Role.SERVER)
            conn.receive_data(await stream.receive_some(65536))
            # A PING comes first: it tells a server that refuses from one that is down.
            ping, publish = conn.next_events()
            assert isinstance(ping, Ping) and publish == Publish("r", seq, b"queued while down")
            await stream.send_all(conn.send(Ack(seq)))
            while client.unacked:
                await trio.sleep(0.01)
            await stream.aclose()
            await listeners[0].aclose()
            while len(states) < 2:
                await trio.sleep(0.01)
            await client.aclose()
            nursery.cancel_scope.cancel()
    assert states == [ConnectionState.CONNECTED, ConnectionState.DISCONNECTED]
    with pytest.raises(ClientClosed):
        await client.publish("r", b"x")


class RecordingServer:
    """Accepts connections, decodes what the client sends, answers only when told."""

    def __init__(self) -> None:
        self.connections: list[tuple[trio.SocketStream, FiggConnection, list[Any]]] = []
        self.new_frame = trio.Event()
        self.port = 0

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = FiggConnection(Role.SERVER)
        received: list[Any] = []
        self.connections.append((stream, conn, received))
        try:
            while data := await stream.receive_some(65536):
                conn.receive_data(data)
                received += conn.next_events()
                self.new_frame.set()
                self.new_frame = trio.Event()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def wait_for(self, index: int, count: int) -> list[Any]:
        while len(self.connections) <= index or len(self.connections[index][2]) < count:
            await self.new_frame.wait()
        return self.connections[index][2]

    async def reply(self, index: int, *events: Any) -> None:
        stream, conn, _ = self.connections[index]
        await stream.send_all(b"".join(conn.send(e) for e in events))


@asynccontextmanager
async def recorded_client(**options: Any
                          ) -> AsyncIterator[tuple[RecordingServer, FiggClient, trio.Nursery]]:
    """A :class:`FiggClient` dialling a :class:`RecordingServer`, both running in the
    yielded nursery (redial at once, no pings and no refusal detection unless ``options``
    say otherwise)."""
    server = RecordingServer()
    async with trio.open_nursery() as nursery:
        server.port = await nursery.start(serve_local, server._handle)
        client = FiggClient("127.0.0.1", server.port, **{
            "backoff": lambda a: 0.0, "ping_interval": float("inf"), "max_refusals": None,
            **options})
        await nursery.start(client.run)
        yield server, client, nursery
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_resend_order_after_reconnect():
    with trio.fail_after(10):
        async with recorded_client() as (server, client, nursery):
            await client.wait_connected()
            nursery.start_soon(lambda: client.subscribe("attached", from_offset=0))
            await server.wait_for(0, 1)
            await server.reply(0, Attached("attached", 0))
            nursery.start_soon(lambda: client.subscribe("gone"))
            await server.wait_for(0, 2)
            await server.reply(0, Attached("gone", 3))
            stream = server.connections[0][0]
            await stream.send_all(frame(MessageType.DATA, b"attached", 41, b"x"))
            nursery.start_soon(lambda: client.subscribe("pending", from_offset=7, wait=False))
            await server.wait_for(0, 3)
            nursery.start_soon(lambda: client.unsubscribe("gone"))
            await server.wait_for(0, 4)
            for i in range(3):
                await client.publish("p", b"%d" % i)
            first = await server.wait_for(0, 7)
            assert first[2:] == [Attach(RESUME, "pending", 7), Detach("gone"),
                                 Publish("p", 1, b"0"), Publish("p", 2, b"1"),
                                 Publish("p", 3, b"2")]
            await server.reply(0, Ack(1))
            while client.unacked != 2:
                await trio.sleep(0.01)
            await stream.aclose()  # drop; the client redials at once
            second = await server.wait_for(1, 5)
            assert second == [Attach(RESUME, "pending", 7), Attach(RESUME, "attached", 41),
                              Detach("gone"), Publish("p", 2, b"1"), Publish("p", 3, b"2")]
            await server.reply(1, Detached("gone"), Ack(3))
            while client.unacked:
                await trio.sleep(0.01)


async def test_two_unanswered_pings_disconnect():
    states: list[ConnectionState] = []
    with trio.fail_after(10):
        async with recorded_client(ping_interval=0.05, backoff=lambda a: 10.0 if a else 0.0,
                                   on_state_change=states.append) as (server, _, _):
            pings = await server.wait_for(0, 2)
            assert all(isinstance(p, Ping) for p in pings)
            while ConnectionState.DISCONNECTED not in states:
                await trio.sleep(0.01)
            assert len(server.connections[0][2]) == 2  # 2 pings, no third


async def test_answered_pings_keep_the_connection():
    with trio.fail_after(10):
        async with figg_server(MemoryBackend()) as server, \
                open_figg_client(server.host, server.port, ping_interval=0.02) as client:
            await client.wait_connected()
            await trio.sleep(0.3)
            assert client.connections == 1
            assert client.state is ConnectionState.CONNECTED


async def test_detach_resent_until_detached():
    with trio.fail_after(10):
        async with recorded_client() as (server, client, nursery):
            nursery.start_soon(lambda: client.subscribe("d"))
            await server.wait_for(0, 1)
            await server.reply(0, Attached("d", 0))
            done = trio.Event()

            async def unsubscribe() -> None:
                await client.unsubscribe("d")
                done.set()

            nursery.start_soon(unsubscribe)
            await server.wait_for(0, 2)
            for index in (1, 2):
                await server.connections[index - 1][0].aclose()
                assert await server.wait_for(index, 1) == [Detach("d")]
            assert not done.is_set()
            await server.reply(2, Detached("d"))
            await done.wait()


async def test_subscribe_twice_is_refused():
    with trio.fail_after(5):
        async with figg_server(MemoryBackend()) as server, \
                open_figg_client(server.host, server.port, **FAST) as client:
            await client.subscribe("x")
            with pytest.raises(ValueError):
                await client.subscribe("x")


def test_backoff_is_pluggable():
    calls = itertools.count()
    client = FiggClient("127.0.0.1", 1, backoff=lambda a: float(next(calls)))
    assert client.backoff(5) == 0.0 and client.backoff(5) == 1.0


async def test_aclose_wakes_waiting_calls():
    with trio.fail_after(5):
        async with recorded_client(window=1) as (server, client, nursery):  # never answers
            errors: list[str] = []

            async def expect_closed(name: str, call: Any) -> None:
                try:
                    await call()
                except ClientClosed:
                    errors.append(name)

            nursery.start_soon(expect_closed, "publish_and_wait",
                               lambda: client.publish_and_wait("t", b"x"))
            await server.wait_for(0, 1)
            nursery.start_soon(expect_closed, "publish", lambda: client.publish("t", b"y"))
            nursery.start_soon(expect_closed, "subscribe", lambda: client.subscribe("s"))
            await server.wait_for(0, 2)
            await trio.sleep(0.05)
            await client.aclose()
            while len(errors) < 3:
                await trio.sleep(0.01)
            assert sorted(errors) == ["publish", "publish_and_wait", "subscribe"]


# -- refusals and outages ----------------------------------------------------------------------

REDIAL_AT_ONCE = {"backoff": lambda attempt: 0.0, "ping_interval": float("inf")}


@pytest.mark.parametrize("operation", ["publish", "subscribe"])
async def test_a_refused_request_raises_instead_of_redialling(operation: str):
    # The server closes the connection on an invalid topic name; even redialling at once,
    # the client stops after max_refusals connections and says which request it was.
    with trio.fail_after(10):
        async with figg_server(MemoryBackend()) as server, \
                dropping_proxy(server.host, server.port) as proxy, \
                open_figg_client("127.0.0.1", proxy.port, max_refusals=3,
                                 **REDIAL_AT_ONCE) as client:
            await client.publish_and_wait("fine", b"accepted first")
            with pytest.raises(RequestRefused) as refused:
                if operation == "publish":
                    await client.publish_and_wait("bad name", b"x")
                else:
                    await client.subscribe("bad name")
            assert (refused.value.operation, refused.value.topic) == (operation, "bad name")
            connections = proxy.connections
            assert connections == 1 + 3  # the first served one, then three refused
            await trio.sleep(0.3)
            assert proxy.connections == connections  # and no more
            assert client.failure is refused.value
            with pytest.raises(RequestRefused):
                await client.publish("fine", b"after giving up")


async def test_an_outage_behind_a_proxy_is_redialled_not_refused():
    # A proxy whose server is down accepts and resets: the opening PING is never
    # answered, so that is an outage, redialled (with backoff) for as long as it lasts.
    attempts: list[int] = []

    def backoff(attempt: int) -> float:
        attempts.append(attempt)
        return 0.0 if attempt == 0 else 0.01

    with trio.fail_after(10):
        async with figg_server(MemoryBackend()) as server, \
                dropping_proxy(server.host, server.port) as proxy, \
                open_figg_client("127.0.0.1", proxy.port, max_refusals=2, backoff=backoff,
                                 ping_interval=float("inf")) as client:
            await client.publish_and_wait("outage", b"before")  # the proxy is connected
            proxy.refuse = True
            proxy.drop()
            seq = await client.publish("outage", b"kept")
            while proxy.refused < 10:
                await trio.sleep(0.01)
            assert client.failure is None
            # Connections that proved nothing do not start the backoff over.
            assert attempts[-5:] == list(range(attempts[-1] - 4, attempts[-1] + 1))
            proxy.refuse = False
            acked = trio.Event()
            client._unacked[-1].on_ack = lambda _: acked.set()
            await acked.wait()
            assert client.unacked == 0 and seq == 2


async def test_a_server_that_does_not_speak_figg_fails_at_once():
    async def garbage(stream: trio.SocketStream) -> None:
        await stream.send_all(b"\xff" * 64)
        await trio.sleep_forever()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_local, garbage)
            async with open_figg_client("127.0.0.1", port, **REDIAL_AT_ONCE) as client:
                with pytest.raises(BadResponse, match="not Figg"):
                    await client.publish_and_wait("t", b"x")
            nursery.cancel_scope.cancel()


async def test_a_frame_cut_short_by_the_connection_end_is_a_lost_connection():
    """A server (or a path) that dies mid-frame sent nothing wrong, only too little: the
    client redials and delivers, it does not call the server "not Figg"."""
    cut = 0

    async with figg_server(MemoryBackend()) as server, \
            dropping_proxy(server.host, server.port) as proxy:
        async def cut_first(stream: trio.SocketStream) -> None:
            nonlocal cut
            if cut:
                await proxy._handle(stream)
                return
            cut += 1
            await stream.receive_some(1024)  # the PUBLISH
            await stream.send_all(encode_ack_frame(1)[:5])  # part of its ACK, then FIN
            await stream.aclose()

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_local, cut_first)
                async with open_figg_client("127.0.0.1", port, **REDIAL_AT_ONCE) as client:
                    await client.publish_and_wait("cut", b"kept")
                    assert client.failure is None and cut == 1 and proxy.connections == 1
                nursery.cancel_scope.cancel()


async def test_first_connect_attempts_bound_an_unreachable_server():
    with trio.fail_after(10):
        async with figg_server(MemoryBackend()) as server:
            port = server.port  # closed once the block ends
        async with open_figg_client("127.0.0.1", port, first_connect_attempts=2,
                                    **REDIAL_AT_ONCE) as client:
            with pytest.raises(ConnectError, match="Connection refused"):
                await client.wait_connected()
