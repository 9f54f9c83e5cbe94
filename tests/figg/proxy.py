"""A TCP proxy for tests that cuts connections on demand, mid-stream."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from functools import partial

import trio


class DroppingProxy:
    """Forwards 127.0.0.1:``port`` to a target; :meth:`drop` cuts every connection.

    ``cut_upstream_after`` / ``cut_downstream_after`` cut a connection once that many
    bytes went client->server / server->client through it (mid-frame, typically).
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.drops = 0
        self.connections = 0
        self.cut_upstream_after: int | None = None
        self.cut_downstream_after: int | None = None
        self.refuse = False
        #: Connections accepted and reset at once while ``refuse`` was set.
        self.refused = 0
        self._scopes: set[trio.CancelScope] = set()

    def drop(self) -> None:
        """Cut every open connection (both directions at once)."""
        for scope in list(self._scopes):
            scope.cancel()

    async def _handle(self, client: trio.SocketStream) -> None:
        if self.refuse:
            self.refused += 1
            await _reset(client)
            return
        try:
            server = await trio.open_tcp_stream(*self.target)
        except OSError:
            await _reset(client)
            return
        self.connections += 1
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, server, "up", scope)
                    nursery.start_soon(self._pump, server, client, "down", scope)
            finally:
                self._scopes.discard(scope)
        self.drops += 1
        await _reset(client)
        await _reset(server)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, direction: str,
                    scope: trio.CancelScope) -> None:
        sent = 0
        try:
            while True:
                data = await source.receive_some(65536)
                if not data:
                    break
                limit = (self.cut_upstream_after if direction == "up"
                         else self.cut_downstream_after)
                if limit is not None and sent + len(data) >= limit:
                    await sink.send_all(data[:max(0, limit - sent)])
                    break
                await sink.send_all(data)
                sent += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()


async def serve_local(handler: Callable[[trio.SocketStream], Awaitable[None]], *,
                      task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``handler`` on a free 127.0.0.1 port; ``task_status.started(port)``."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        task_status.started(listeners[0].socket.getsockname()[1])


async def _reset(stream: trio.SocketStream) -> None:
    """Close with RST, like a dropped network path, rather than a polite FIN."""
    with suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    await trio.aclose_forcefully(stream)


@asynccontextmanager
async def dropping_proxy(host: str, port: int) -> AsyncIterator[DroppingProxy]:
    proxy = DroppingProxy(host, port)
    async with trio.open_nursery() as nursery:
        proxy.port = await nursery.start(serve_local, proxy._handle)
        yield proxy
        nursery.cancel_scope.cancel()
