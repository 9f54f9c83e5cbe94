"""Client behaviour against fake brokers (greeting, loss, timeouts, garbage) and the
exceptions' pickling."""

from __future__ import annotations

import functools
import pickle
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from gateway.client.errors import (
    BadResponse,
    BoundaryError,
    ClientClosed,
    ConnectError,
    ConnectionLost,
    PartitionFault,
    ProduceFailed,
    RequestFailed,
    RequestTimeout,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from gateway.client.tank import TankClient, open_tank_client

PING = b"\x03\x00\x00\x00\x00"


@asynccontextmanager
async def fake_broker(behaviour: Callable[[trio.SocketStream], Awaitable[None]]
                      ) -> AsyncIterator[int]:
    """A listener on 127.0.0.1 whose connections run ``behaviour``; yields its port."""
    async def handler(stream: trio.SocketStream) -> None:
        try:
            await behaviour(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0,
                                                          host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def test_connect_refused() -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(ConnectError), trio.fail_after(5):
        async with open_tank_client("127.0.0.1", port):
            pass


async def test_connect_waits_for_the_greeting() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with fake_broker(silent) as port:
        with pytest.raises(ConnectError, match="did not greet"), trio.fail_after(5):
            async with open_tank_client("127.0.0.1", port, connect_timeout=0.2):
                pass


async def test_connection_lost_while_waiting() -> None:
    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.send_all(PING)
        await stream.receive_some(1024)  # the request arrives; never answered

    async with fake_broker(hang_up) as port, \
            open_tank_client("127.0.0.1", port) as client:
        with pytest.raises(ConnectionLost), trio.fail_after(5):
            await client.status()
        with pytest.raises(ConnectionLost):
            await client.status()  # no reconnect: every later call fails the same way


async def test_a_frame_cut_short_is_a_lost_connection_not_a_bad_broker() -> None:
    async def cut_short(stream: trio.SocketStream) -> None:
        await stream.send_all(PING)
        await stream.receive_some(1024)
        await stream.send_all(struct.pack("<BI", 0x0A, 64) + b"\0" * 10)  # then FIN
        await stream.aclose()

    async with fake_broker(cut_short) as port, \
            open_tank_client("127.0.0.1", port) as client:
        with pytest.raises(ConnectionLost, match="middle of a frame"), trio.fail_after(5):
            await client.status()


async def test_request_timeout() -> None:
    async def mute(stream: trio.SocketStream) -> None:
        await stream.send_all(PING)
        await trio.sleep_forever()

    async with fake_broker(mute) as port, \
            open_tank_client("127.0.0.1", port, request_timeout=0.1) as client:
        with pytest.raises(RequestTimeout), trio.fail_after(5):
            await client.status()


async def test_garbage_from_the_broker() -> None:
    async def garbage(stream: trio.SocketStream) -> None:
        await stream.send_all(PING)
        await stream.receive_some(1024)
        await stream.send_all(struct.pack("<BI", 0x0A, 4) + struct.pack("<I", 999))
        await trio.sleep_forever()

    async with fake_broker(garbage) as port, \
            open_tank_client("127.0.0.1", port) as client:
        with pytest.raises(BadResponse, match="unknown request id"), trio.fail_after(5):
            await client.status()


async def test_calls_after_close() -> None:
    async def greet(stream: trio.SocketStream) -> None:
        await stream.send_all(PING)
        await trio.sleep_forever()

    async with fake_broker(greet) as port:
        async with open_tank_client("127.0.0.1", port) as client:
            pass
        with pytest.raises(ClientClosed):
            await client.status()
    with pytest.raises(ClientClosed):
        await TankClient("127.0.0.1", 1).status()  # never connected


async def test_too_many_topics_is_refused_locally() -> None:
    async def greet(stream: trio.SocketStream) -> None:
        await stream.send_all(PING)
        await trio.sleep_forever()

    async with fake_broker(greet) as port, open_tank_client("127.0.0.1", port) as client:
        with pytest.raises(ValueError, match="255"):
            await client.produce({(f"t{i}", 0): [b"x"] for i in range(300)})


@pytest.mark.parametrize("error", [
    ConnectError("no"), ConnectionLost("gone"), ClientClosed("closed"),
    RequestTimeout("slow"), BadResponse("bad"), UnknownTopicError("t"),
    UnknownPartitionError("t", 3), BoundaryError("t", 1, 5, 10, 20),
    PartitionFault("t", 0, 0xFB), ProduceFailed({("t", 0): 2, ("u", 1): 0xFF}),
    TopicExistsError("t"), RequestFailed("create_topic", 4, "invalid_config"),
])
def test_exceptions_pickle_with_their_fields(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)
