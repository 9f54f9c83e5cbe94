"""A small WebSocket client for the tests: trio sockets, frames by wsproto."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import trio
import wsproto.events as ws
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState


class WsClient:
    """One WebSocket to the HTTP listener's ``/ws``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = WSConnection(ConnectionType.CLIENT)
        self.messages: list[Any] = []
        #: The close code and reason the server sent, once it did.
        self.closed: tuple[int, str] | None = None
        self._text = ""

    @classmethod
    async def connect(cls, host: str, port: int, target: str = "/ws") -> WsClient:
        client = cls(await trio.open_tcp_stream(host, port))
        await client.stream.send_all(client.conn.send(ws.Request(host="localhost",
                                                                 target=target)))
        while True:
            await client._receive()
            for event in client.conn.events():
                if isinstance(event, ws.AcceptConnection):
                    return client
                if isinstance(event, ws.RejectConnection):
                    raise ConnectionRefusedError(event.status_code)

    async def send(self, value: Any) -> None:
        await self.stream.send_all(self.conn.send(ws.TextMessage(data=json.dumps(value))))

    async def send_raw(self, event: Any) -> None:
        await self.stream.send_all(self.conn.send(event))

    async def _receive(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data and self.conn.state is ConnectionState.CLOSED:
            return  # the close handshake is over; the server then ends the TCP connection
        self.conn.receive_data(data or None)

    async def next(self, timeout: float = 10) -> Any:
        """The next JSON message; None once the server closed."""
        with trio.fail_after(timeout):
            first = True  # what came with the 101 (the hello) is read already
            while not self.messages:
                if self.closed is not None:
                    return None
                if not first:
                    await self._receive()
                first = False
                for event in self.conn.events():
                    if isinstance(event, ws.TextMessage):
                        self._text += event.data
                        if event.message_finished:
                            self.messages.append(json.loads(self._text))
                            self._text = ""
                    elif isinstance(event, ws.CloseConnection):
                        self.closed = self.closed or (event.code, event.reason)
                        if self.conn.state is not ConnectionState.REMOTE_CLOSING:
                            continue
                        with contextlib.suppress(trio.BrokenResourceError,
                                                 trio.ClosedResourceError):
                            await self.stream.send_all(self.conn.send(event.response()))
        return self.messages.pop(0)

    async def until(self, op: str, timeout: float = 10) -> Any:
        while True:
            message = await self.next(timeout)
            if message is None or message["op"] == op:
                return message

    async def wait_closed(self, timeout: float = 10) -> tuple[int, str]:
        while self.closed is None:
            if await self.next(timeout) is None:
                break
        assert self.closed is not None
        return self.closed

    async def aclose(self) -> None:
        await self.stream.aclose()


def websockets_close(url: str, *sent: str | bytes, origin: str | None = None
                     ) -> tuple[int, str, list[Any]]:
    """With the ``websockets`` library (a client the project did not write, blocking: run
    it in a thread): send ``sent`` right after the handshake; the close code and reason
    received (a close frame, not just the TCP close), and the messages before it. A
    refused upgrade raises ``websockets``' InvalidStatus."""
    got: list[Any] = []
    with connect(url, open_timeout=5, close_timeout=2,
                 origin=origin) as socket_:  # type: ignore[arg-type]
        for message in sent:
            socket_.send(message)
        try:
            while True:
                got.append(json.loads(socket_.recv(timeout=5)))
        except ConnectionClosed as exc:
            assert exc.rcvd is not None, "no close frame received"
            return exc.rcvd.code, exc.rcvd.reason, got
    raise AssertionError("not closed")

