"""Shared helpers of the Tank tests: a listener on a loopback port over a real store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway.core.config import Settings
from gateway.core.contract import Backend
from gateway.core.metrics import Metrics
from protocols.connection import CLOSED, NEED_DATA, Role
from protocols.tank.connection import TankConnection
from tests.listeners import RunningServer, listening


@asynccontextmanager
async def serving(backend: Backend, settings: Settings,
                  metrics: Metrics | None = None) -> AsyncIterator[RunningServer]:
    """Serve Tank over ``backend`` on 127.0.0.1 with an ephemeral port."""
    async with listening("tank", backend, settings, metrics) as server:
        yield server


@asynccontextmanager
async def tank_server(data_dir: Path, **overrides: Any) -> AsyncIterator[RunningServer]:
    """The embedded store in ``data_dir`` served on an ephemeral loopback port."""
    options: dict[str, Any] = {"durability": "os"}
    options.update(overrides)
    async with listening("tank", None, Settings(data_dir=data_dir, **options)) as server:
        yield server


class RawClient:
    """Tank frames over a socket with the project's codec, for protocol-level tests."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = TankConnection(Role.CLIENT)

    @classmethod
    async def connect(cls, server: RunningServer) -> RawClient:
        return cls(await trio.open_tcp_stream(server.host, server.port))

    async def send(self, *messages: Any) -> None:
        await self.stream.send_all(b"".join(self.conn.send(m) for m in messages))

    async def next(self) -> Any:
        """The next event (a Reply or Ping); EOFError when the server closes."""
        while True:
            event = self.conn.next_event()
            if event is CLOSED:
                raise EOFError("server closed the connection")
            if event is not NEED_DATA:
                return event
            self.conn.receive_data(await self.stream.receive_some(65536))

    async def aclose(self) -> None:
        await self.stream.aclose()


async def read_until_closed(stream: trio.SocketStream, limit: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = bytearray()
    with trio.fail_after(limit):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return bytes(received)
            if not data:
                return bytes(received)
            received += data
