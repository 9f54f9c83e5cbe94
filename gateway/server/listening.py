"""What both listeners do around a connection: bind, admit, count, and log its end."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final, Protocol

import structlog
import trio
from trio.lowlevel import ParkingLot

from gateway.server.config import parse_address
from gateway.server.metrics import Metrics
from protocols.errors import FrameTooLarge, ProtocolError

#: Bytes asked of the socket per read: read big, then parse every frame in the buffer.
RECEIVE_SIZE: Final = 256 * 1024
#: Seconds a closing connection gets to send what it still owes (ACKs, replies).
DRAIN_SECS: Final = 5.0


class SessionEnd(Protocol):
    """How a session ended: a short ``kind`` for metrics and a ``reason`` for people."""

    kind: str
    reason: str


class CloseConnection(Exception):
    """End the connection: ``kind`` is a short metric label, ``reason`` the logged text."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


async def receive_or_close(stream: trio.abc.ReceiveStream) -> bytes:
    """The next bytes from the peer (``b""`` at EOF); a broken socket ends the connection."""
    try:
        return await stream.receive_some(RECEIVE_SIZE)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise CloseConnection("reset", f"receive failed: {exc!r}") from None


def socket_fd(stream: object) -> int:
    """The descriptor of a plain TCP stream, for :func:`send_now`; -1 for anything else
    (TLS, memory streams in tests)."""
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno()
    return -1


def send_now(fd: int, data: bytes) -> bytes:
    """Write what the socket ``fd`` takes at once, without waiting; returns the rest.

    An outbox whose writer task is idle uses this to send a reply the moment it is made,
    instead of waking the task. Any failure (a full buffer, a broken connection, no plain
    socket: ``fd`` -1) writes nothing here: the writer task sends the rest and meets the
    error itself.
    """
    if fd < 0:
        return data
    try:
        sent = os.write(fd, data)
    except OSError:
        return data
    return data[sent:] if sent else data


def protocol_close(exc: ProtocolError) -> CloseConnection:
    """The close a peer's protocol violation calls for."""
    kind = "frame_too_large" if isinstance(exc, FrameTooLarge) else "protocol_error"
    return CloseConnection(kind, str(exc))


class SendBudget:
    """The bytes queued for one connection's socket, against the connection's limit.

    The connection's outbox calls :meth:`add` when it queues and :meth:`release` once
    bytes are written (or dropped); producers of output call :meth:`wait_writable` before
    making more, so a peer that does not read stops being served instead of growing the
    queue. :meth:`close` releases every waiter for good.
    """

    __slots__ = ("_drained", "_has_space", "closed", "limit", "queued")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("the outbox limit must be positive")
        self.limit = limit
        #: Bytes queued or being written.
        self.queued = 0
        self.closed = False
        self._has_space = ParkingLot()
        self._drained = ParkingLot()

    def add(self, size: int) -> None:
        self.queued += size

    def release(self, size: int) -> None:
        """``size`` bytes left the queue: wake whoever waits for space or for empty."""
        self.queued -= size
        if self.queued < self.limit:
            self._has_space.unpark_all()
            if not self.queued:
                self._drained.unpark_all()

    def close(self) -> None:
        self.closed = True
        self.queued = 0
        self._has_space.unpark_all()
        self._drained.unpark_all()

    async def wait_writable(self) -> None:
        """Wait until the queue is under its limit (no checkpoint when it already is)."""
        while self.queued >= self.limit and not self.closed:
            await self._has_space.park()

    async def wait_empty(self) -> None:
        """Wait until everything queued has been written."""
        while self.queued and not self.closed:
            await self._drained.park()


def peer_name(stream: trio.SocketStream) -> str:
    """``host:port`` of the peer (``[v6]:port``), or ``?`` when the socket can not tell."""
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError, AttributeError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def open_listeners(address: str, protocol: str,
                         log: structlog.typing.FilteringBoundLogger
                         ) -> list[trio.SocketListener]:
    """Bind ``HOST:PORT`` and log each bound address."""
    host, port = parse_address(address)
    listeners = await trio.open_tcp_listeners(port, host=host)
    for listener in listeners:
        log.info("listening", protocol=protocol, address=listener.socket.getsockname()[:2])
    return listeners


class ConnectionSlots:
    """Admits a listener's connections up to ``limit`` and accounts for each one.

    :meth:`serve` runs one session and never raises (except Cancelled): a failing
    connection must not stop the accept loop. Every connection ends with one
    ``connection_closed`` log line naming its peer, kind and reason. :meth:`shutdown`
    tells every session (and any that starts later) that the server is stopping.
    """

    def __init__(self, protocol: str, limit: int, metrics: Metrics,
                 log: structlog.typing.FilteringBoundLogger, routine_kinds: frozenset[str]
                 ) -> None:
        self.protocol = protocol
        self.limit = limit
        self.metrics = metrics
        self.log = log
        self.routine_kinds = routine_kinds
        #: Connections being served.
        self.active = 0
        self._sessions: set[Any] = set()
        self._closing = False

    def shutdown(self) -> None:
        """Call ``shutdown()`` on every session, now and as each later one starts: they
        stop reading, finish what is in flight and close."""
        self._closing = True
        for session in list(self._sessions):
            session.shutdown()

    async def serve(self, stream: trio.SocketStream,
                    start: Callable[[Any], Any],
                    stats: Callable[[Any], dict[str, Any]]) -> None:
        """Serve ``stream`` with the session ``start(conn_log)`` builds (it has ``run()``
        and ``shutdown()``).

        ``stats(session)`` gives the fields added to the closing log line.
        """
        protocol, metrics = self.protocol, self.metrics
        conn_log = self.log.bind(peer=peer_name(stream), protocol=protocol)
        metrics.connections_accepted.labels(protocol).inc()
        if self.active >= self.limit:
            metrics.connections_closed.labels(protocol, "limit").inc()
            conn_log.warning("connection_closed", kind="limit",
                             reason=f"over {self.limit} connections")
            await trio.aclose_forcefully(stream)
            return
        self.active += 1
        metrics.connections.labels(protocol).inc()
        session = start(conn_log)
        self._sessions.add(session)
        if self._closing:
            session.shutdown()
        kind, reason = "shutdown", "server shutting down"
        try:
            end = await session.run()
            kind, reason = end.kind, end.reason
        except Exception as exc:
            kind, reason = "internal_error", repr(exc)
            conn_log.exception("session_crashed")
        finally:
            self._sessions.discard(session)
            self.active -= 1
            metrics.connections.labels(protocol).dec()
            metrics.connections_closed.labels(protocol, kind).inc()
            level = conn_log.info if kind in self.routine_kinds else conn_log.warning
            level("connection_closed", kind=kind, reason=reason, **stats(session))
            await trio.aclose_forcefully(stream)
