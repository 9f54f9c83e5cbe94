"""Raw loopback sockets for the soak: connecting, telling whether the peer closed a
connection nobody reads, and a minimal HTTP/1.1 GET."""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from typing import Final

import trio

from gateway.core.config import parse_address

#: ``tcpi_state`` of an open connection (linux/tcp_states.h: TCP_ESTABLISHED).
_ESTABLISHED: Final = 1
CONNECT_TIMEOUT: Final = 5.0


def loopback_address(text: str) -> tuple[str, int]:
    """``host:port`` as ``(host, port)``; ValueError unless every address the host names
    is a loopback one (the soak attacks nothing else)."""
    host, port = parse_address(text)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"{text}: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not address.is_loopback:
            raise ValueError(f"{text}: not a loopback address ({address}); "
                             f"the soak only attacks this machine's loopback")
    return host, port


async def connect(address: tuple[str, int], timeout: float = CONNECT_TIMEOUT
                  ) -> trio.SocketStream:
    """A TCP connection; OSError (also when it takes longer than ``timeout``)."""
    with trio.move_on_after(timeout):
        return await trio.open_tcp_stream(*address)
    raise OSError(f"no connection to {address[0]}:{address[1]} within {timeout:g} s")


def peer_closed(stream: trio.SocketStream) -> bool:
    """Whether the peer closed (FIN or RST) a connection, without reading from it: the
    kernel's TCP state leaves ESTABLISHED when the peer's FIN or RST arrives, even while
    unread bytes wait in the receive buffer."""
    try:
        info = stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except OSError:
        return True
    return info[0] != _ESTABLISHED


async def close(stream: trio.SocketStream) -> None:
    """Close without waiting for anything (abort when unread bytes are pending)."""
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(stream)


@dataclass(frozen=True)
class HttpAnswer:
    """One HTTP exchange: ``status`` 0 when no status line came back."""

    status: int
    body_bytes: int
    seconds: float
    error: str = ""


def http_request(target: str, line_end: bytes = b"\r\n") -> bytes:
    """A GET for ``target``, lines ended by ``line_end`` (a bare LF is legal HTTP)."""
    lines = [f"GET {target} HTTP/1.1".encode(), b"Host: soak", b"Connection: close", b""]
    return line_end.join(lines) + line_end


async def http_get(address: tuple[str, int], target: str, *, timeout: float = 10.0,
                   line_end: bytes = b"\r\n") -> HttpAnswer:
    """GET ``target`` on a new connection and read the whole answer (to the end of the
    body its Content-Length gives, or until the server closes)."""
    start = time.monotonic()
    status = body = 0
    try:
        with trio.fail_after(timeout):
            stream = await connect(address, timeout)
            try:
                await stream.send_all(http_request(target, line_end))
                status, body = await _read_answer(stream)
            finally:
                await close(stream)
    except (OSError, trio.BrokenResourceError, trio.TooSlowError, ValueError) as exc:
        return HttpAnswer(status, body, time.monotonic() - start,
                          type(exc).__name__ + (f": {exc}" if str(exc) else ""))
    return HttpAnswer(status, body, time.monotonic() - start)


async def _read_answer(stream: trio.SocketStream) -> tuple[int, int]:
    """``(status, body bytes)`` of the answer on ``stream``."""
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            raise ValueError("closed before the answer's head")
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    got = len(rest)
    while length is None or got < length:
        data = await stream.receive_some(65536)
        if not data:
            break
        got += len(data)
    return status, got
