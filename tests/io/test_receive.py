"""``receive``: a session's read of a plain socket, without trio's stream wrappers,
keeps ``receive_some``'s rules (real loopback sockets)."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from gateway.io.reading import receive


def loopback_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    accepted.setblocking(False)
    return client, accepted


class Turns:
    """Counts the turns another task gets while a test reads."""

    def __init__(self) -> None:
        self.count = 0

    async def take(self) -> None:
        while True:
            self.count += 1
            await trio.lowlevel.checkpoint()


async def test_waits_for_data_then_returns_what_is_there() -> None:
    client, accepted = loopback_pair()
    with client, accepted:
        async def send_later() -> None:
            await trio.sleep(0.05)
            client.sendall(b"hello")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_later)
            with trio.fail_after(5):
                assert await receive(accepted.fileno(), 100) == b"hello"
        client.sendall(b"abcdef")
        await trio.sleep(0.05)
        assert await receive(accepted.fileno(), 4) == b"abcd"
        assert await receive(accepted.fileno(), 100) == b"ef"
        client.shutdown(socket.SHUT_WR)
        with trio.fail_after(5):
            assert await receive(accepted.fileno(), 100) == b""


async def test_a_cancelled_caller_reads_nothing() -> None:
    client, accepted = loopback_pair()
    with client, accepted:
        client.sendall(b"kept")
        await trio.sleep(0.05)
        with trio.CancelScope() as scope:
            scope.cancel()
            await receive(accepted.fileno(), 100)
            pytest.fail("a cancelled read returned")
        assert scope.cancelled_caught
        assert await receive(accepted.fileno(), 100) == b"kept"


@asynccontextmanager
async def fifty_bytes_waiting() -> AsyncIterator[tuple[int, Turns]]:
    """A socket with 50 bytes ready to read (its fd), beside a task counting its turns."""
    client, accepted = loopback_pair()
    turns = Turns()
    with client, accepted:
        client.sendall(b"x" * 50)
        await trio.sleep(0.05)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(turns.take)
            yield accepted.fileno(), turns
            nursery.cancel_scope.cancel()


async def test_data_that_was_there_still_yields_to_other_tasks() -> None:
    async with fifty_bytes_waiting() as (fd, turns):
        for _ in range(50):  # never waits: the bytes are there
            assert await receive(fd, 1) == b"x"
        assert turns.count > 0


async def test_a_reset_connection_raises_oserror() -> None:
    client, accepted = loopback_pair()
    with accepted:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # linger 0: RST
        with trio.fail_after(5), pytest.raises(ConnectionResetError):
            await receive(accepted.fileno(), 100)


async def test_an_eager_read_of_data_that_is_there_does_not_yield() -> None:
    async with fifty_bytes_waiting() as (fd, turns):
        await trio.lowlevel.checkpoint()  # the other task runs once
        seen = turns.count
        for _ in range(20):
            assert await receive(fd, 1, eager=True) == b"x"
        assert turns.count == seen
        # A read that is not eager yields: by the second, the other task has had a turn
        # (whichever order the scheduler ran the two in the first round).
        for _ in range(2):
            assert await receive(fd, 1) == b"x"
        assert turns.count > seen
        with trio.CancelScope() as scope:  # a cancelled eager read reads nothing
            scope.cancel()
            await receive(fd, 1, eager=True)
        assert scope.cancelled_caught
        assert await receive(fd, 100, eager=True) == b"x" * 28
