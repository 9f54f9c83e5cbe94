"""What both listeners do around a connection: admit, secure (TLS), count, and log its end."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar, cast

import structlog
import trio

from gateway.core.metrics import Metrics
from gateway.io.limits import RECEIVE_SIZE
from gateway.serving.idling import IdleSweeper
from gateway.serving.session import CloseConnection
from gateway.serving.tls import ListenerTLS, peer_identity


class Served(Protocol):
    """A connection's session, as its listener runs it."""

    async def run(self) -> CloseConnection:
        """Serve the connection until it ends; why it ended."""
        ...

    def shutdown(self) -> None:
        """The server is stopping: stop reading, finish what is in flight."""


S = TypeVar("S", bound=Served)
#: Builds a connection's session: ``start(stream, conn_log)`` (the stream is the TLS one
#: on a TLS listener).
Start = Callable[[trio.abc.Stream, structlog.typing.FilteringBoundLogger], S]
#: The fields a session's ``connection_closed`` line adds.
Stats = Callable[[S], dict[str, Any]]


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under ``stream`` (TLS unwrapped), or None."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    socket: trio.socket.SocketType | None = getattr(stream, "socket", None)
    return socket


def _address(stream: trio.abc.Stream, which: str) -> tuple[str, int] | None:
    try:
        host, port, *_ = getattr(socket_of(stream), which)()
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return host, port


def peer_name(stream: trio.abc.Stream) -> str:
    """``host:port`` of the peer (``[v6]:port``), or ``?`` when the socket can not tell."""
    address = _address(stream, "getpeername")
    if address is None:
        return "?"
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def peer_host(stream: trio.abc.Stream) -> str | None:
    """The peer's host, or None when the socket can not tell."""
    address = _address(stream, "getpeername")
    return None if address is None else address[0]


def local_host(stream: trio.abc.Stream) -> str | None:
    """The host the peer reached (the connection's local address), or None."""
    address = _address(stream, "getsockname")
    return None if address is None else address[0]


#: How long a connection closed after an error answer waits for the peer to close first.
LINGER_SECS: Final = 1.0


async def close_after_answer(stream: trio.abc.Stream) -> None:
    """Close a connection whose last frame is an error answer so that the peer reads it:
    end our side (TCP FIN) and drop what the peer still sends until it closes, at most
    :data:`LINGER_SECS`. Closing at once with its bytes unread would reset the connection,
    and a reset can destroy the answer before the peer reads it."""
    with trio.move_on_after(LINGER_SECS), contextlib.suppress(
            trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError,
            OSError):
        if isinstance(stream, trio.SocketStream):
            await stream.send_eof()
        while await stream.receive_some(RECEIVE_SIZE):
            pass
    await trio.aclose_forcefully(stream)


class ConnectionLog:
    """A connection's logger: ``log`` bound to its peer, protocol and listener when it is
    first used (most connections log their closing line only, and a bound logger and its
    context held while idle are ~300 bytes). Anything asked of it is the bound logger's."""

    __slots__ = ("_bound", "_listener", "_log", "_peer", "_protocol")

    def __init__(self, log: structlog.typing.FilteringBoundLogger, peer: str, protocol: str,
                 listener: str) -> None:
        self._log = log
        self._peer, self._protocol, self._listener = peer, protocol, listener
        self._bound: structlog.typing.FilteringBoundLogger | None = None

    def __getattr__(self, name: str) -> object:
        bound = self._bound
        if bound is None:
            bound = self._bound = self._log.bind(peer=self._peer, protocol=self._protocol,
                                                 listener=self._listener)
        return getattr(bound, name)


class ConnectionSlots:
    """Admits a listener's connections up to ``limit`` and accounts for each one.

    :meth:`serve` runs one session and never raises (except Cancelled): a failing
    connection must not stop the accept loop. Every connection ends with one
    ``connection_closed`` log line naming its peer, kind and reason. :meth:`shutdown`
    tells every session (and any that starts later) that the server is stopping.
    """

    def __init__(self, protocol: str, limit: int, metrics: Metrics,
                 log: structlog.typing.FilteringBoundLogger, routine_kinds: frozenset[str],
                 *, listener: str | None = None, tls: ListenerTLS | None = None) -> None:
        self.protocol = protocol
        #: The listener's name, in metrics and log lines.
        self.listener = listener or protocol
        #: The listener's TLS, None on a plain one.
        self.tls = tls
        self.limit = limit
        self.metrics = metrics
        self.log = log
        self.routine_kinds = routine_kinds
        #: Connections being served.
        self.active = 0
        self._sessions: set[Served] = set()
        #: Closes the idle ones among them.
        self._idle = IdleSweeper(self._sessions)
        self._closing = False

    def shutdown(self) -> None:
        """Call ``shutdown()`` on every session, now and as each later one starts: they
        stop reading, finish what is in flight and close."""
        self._closing = True
        for session in list(self._sessions):
            session.shutdown()

    async def serve(self, stream: trio.abc.Stream, start: Start[S], stats: Stats[S]) -> None:
        """Serve ``stream`` with the session ``start(stream, conn_log)`` builds (it has
        ``run()`` and ``shutdown()``); on a TLS listener, after the handshake, over the
        TLS stream (a failed handshake ends the connection with its own log line).

        ``stats(session)`` gives the fields added to the closing log line.
        """
        protocol, listener, metrics = self.protocol, self.listener, self.metrics
        peer = peer_name(stream)
        conn_log = cast(structlog.typing.FilteringBoundLogger,
                        ConnectionLog(self.log, peer, protocol, listener))
        metrics.connections_accepted.labels(protocol, listener).inc()
        if self.active >= self.limit:
            metrics.connections_closed.labels(protocol, listener, "limit").inc()
            metrics.limit_hit("max_connections")
            conn_log.warning("connection_closed", kind="limit",
                             reason=f"over {self.limit} connections")
            await trio.aclose_forcefully(stream)
            return
        self.active += 1
        metrics.connections.labels(protocol, listener).inc()
        session = None
        try:
            if self.tls is not None:
                secured = await self.tls.accept(stream, peer)
                if secured is None:
                    metrics.connections_closed.labels(protocol, listener, "tls").inc()
                    return
                stream = secured
                identity = peer_identity(stream)
                if identity is not None:
                    conn_log = conn_log.bind(identity=identity)
            session = start(stream, conn_log)
        finally:
            if session is None:
                self.active -= 1
                metrics.connections.labels(protocol, listener).dec()
                await trio.aclose_forcefully(stream)
        self._sessions.add(session)
        self._idle.started(session)
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
            self._idle.ended()
            self.active -= 1
            metrics.connections.labels(protocol, listener).dec()
            metrics.connections_closed.labels(protocol, listener, kind).inc()
            level = conn_log.info if kind in self.routine_kinds else conn_log.warning
            level("connection_closed", kind=kind, reason=reason, **stats(session))
            if kind in getattr(session, "DRAIN_ON", ()):
                await close_after_answer(stream)
            else:
                await trio.aclose_forcefully(stream)
