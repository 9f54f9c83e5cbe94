"""Shared helpers of the Figg tests: a listener on a loopback port, a raw Figg peer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway.backend.embedded import EmbeddedSettings, open_embedded_backend
from gateway.core.config import Settings
from gateway.core.contract import Backend
from protocols.connection import CLOSED, NEED_DATA, Role
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import ATTACH_FROM_OFFSET, FAST, MessageType
from tests.listeners import RunningServer, listening

RESUME = ATTACH_FROM_OFFSET


@asynccontextmanager
async def figg_server(backend: Backend, **settings: Any) -> AsyncIterator[RunningServer]:
    """Serve Figg over ``backend`` on 127.0.0.1 with an ephemeral port."""
    async with listening("figg", backend, Settings(**settings)) as server:
        yield server


def frame(kind: MessageType, *fields: Any) -> bytes:
    """One whole Figg frame (strings given as bytes)."""
    return FAST[kind].encode_frame(*fields)


def attach(topic: str, offset: int | None = None) -> bytes:
    if offset is None:
        return frame(MessageType.ATTACH, 0, topic.encode(), 0)
    return frame(MessageType.ATTACH, RESUME, topic.encode(), offset)


def detach(topic: str) -> bytes:
    return frame(MessageType.DETACH, topic.encode())


def publish(topic: str, seq: int, data: bytes) -> bytes:
    return frame(MessageType.PUBLISH, topic.encode(), seq, data)


def ping(ts: int) -> bytes:
    return frame(MessageType.PING, ts)


class RawPeer:
    """A Figg client speaking raw frames over a socket, for protocol-level tests."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = FiggConnection(Role.CLIENT)
        self.closed = False

    @classmethod
    async def connect(cls, server: RunningServer) -> RawPeer:
        return cls(await trio.open_tcp_stream(server.host, server.port))

    async def send(self, *frames: bytes) -> None:
        await self.stream.send_all(b"".join(frames))

    async def receive(self, n: int = 1) -> list[Any]:
        """The next ``n`` messages from the server."""
        out: list[Any] = []
        while len(out) < n:
            event = self.conn.next_event()
            if event is NEED_DATA:
                data = await self.stream.receive_some(256 * 1024)
                self.conn.receive_data(data)
                continue
            if event is CLOSED:
                raise EOFError(f"server closed after {out!r}")
            out.append(event)
        return out

    async def receive_one(self) -> Any:
        return (await self.receive(1))[0]

    async def expect_closed(self) -> None:
        """The server closes the connection (anything it sent first is skipped)."""
        while True:
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                return
            if not data:
                return

    async def aclose(self) -> None:
        await self.stream.aclose()


@asynccontextmanager
async def open_test_backend(tmp_path: Any, *, config_bounds: Any = None, **settings: Any
                            ) -> AsyncIterator[Any]:
    """The embedded store in ``tmp_path``: what the end-to-end tests run on.

    ``settings`` are :class:`Settings` fields (e.g. ``durability="os"``); maintenance
    (retention checks by timer) is off, retention still runs when segments roll.
    ``config_bounds`` (e.g. ``NO_BOUNDS``) relaxes the minimums of CreateTopic's config.
    """
    settings.setdefault("retention_check_secs", 0)
    config = Settings(data_dir=Path(tmp_path) / "data", figg_listen="", tank_listen="",
                      metrics_listen="", **settings)
    async with open_embedded_backend(EmbeddedSettings.of(config),
                                     config_bounds=config_bounds) as backend:
        yield backend
