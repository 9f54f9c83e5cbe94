"""A connected pair of TCP streams on 127.0.0.1, and a file-backed chunk."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from gateway.io.fanout import send_each_python
from protocols import native


@asynccontextmanager
async def tcp_pair(*, rcvbuf: int | None = None, sndbuf: int | None = None
                   ) -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    """``(sender, receiver)``: two ends of one loopback connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    sock = trio.socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect(("127.0.0.1", port))
    receiver = trio.SocketStream(sock)
    sender = await listeners[0].accept()
    if sndbuf is not None:
        sender.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    try:
        yield sender, receiver
    finally:
        for stream in (sender, receiver, *listeners):
            await trio.aclose_forcefully(stream)


def reset(stream: trio.SocketStream) -> None:
    """Close ``stream`` with a RST (SO_LINGER 0): the peer's next call fails."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        assert chunk, f"EOF after {len(data)} of {size} bytes"
        data += chunk
    return bytes(data)


class FileRange:
    """A chunk in a file, as the store hands one out."""

    def __init__(self, path: str, offset: int, length: int) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.offset = offset
        self._length = length
        self.closed = False

    @property
    def length(self) -> int:
        return self._length

    def read_bytes(self) -> bytes:
        return os.pread(self.fd, self._length, self.offset)

    def sendfile_source(self) -> tuple[int, int] | None:
        return self.fd, self.offset

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


_compiled_fanout = native.built("gateway.io._fanout")
#: The fan-out send loops to test: the pure-Python reference, and the compiled one where
#: it is built and the run is not a pure-Python one.
FANOUT_LOOPS: list[Callable[..., Any]] = [send_each_python] + (
    [_compiled_fanout.send_each]
    if _compiled_fanout is not None and not native.pure_python_requested() else [])
