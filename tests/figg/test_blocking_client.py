"""The blocking facade: a thread runs trio; calls and received messages cross over."""

from __future__ import annotations

import queue

import pytest
import trio

from gateway.client.errors import RequestRefused
from gateway.client.figg_blocking import BlockingFiggClient
from tests.figg.helpers import figg_server
from tests.figg.memory_backend import MemoryBackend


async def test_blocking_client_from_a_thread():
    def script(port: int) -> list[tuple[int, bytes]]:
        with BlockingFiggClient("127.0.0.1", port, ping_interval=0.5) as client:
            client.wait_connected(timeout=5)
            for i in range(20):
                client.publish("b", b"%d" % i)
            assert client.publish_and_wait("b", b"end") == 21
            sub = client.subscribe("b", from_offset=0, maxsize=4)  # smaller than the topic
            got = [sub.get(timeout=5) for _ in range(21)]
            with pytest.raises(queue.Empty):
                sub.get(timeout=0.05)
            assert sub.last_offset == 21 and sub.start_offset == 0
            sub.unsubscribe()
            with pytest.raises(EOFError):
                sub.get(timeout=1)
        return [(m.offset, m.data) for m in got]

    with trio.fail_after(15):
        async with figg_server(MemoryBackend()) as server:
            got = await trio.to_thread.run_sync(script, server.port)
    assert got == [(i + 1, b"%d" % i) for i in range(20)] + [(21, b"end")]


async def test_blocking_client_raises_a_refusal_instead_of_looping():
    def script(port: int) -> None:
        with BlockingFiggClient("127.0.0.1", port, backoff=lambda attempt: 0.0) as client:
            with pytest.raises(RequestRefused, match="bad name"):
                client.subscribe("bad name")
            with pytest.raises(RequestRefused):
                client.publish("fine", b"after giving up")

    with trio.fail_after(15):
        async with figg_server(MemoryBackend()) as server:
            await trio.to_thread.run_sync(script, server.port)
