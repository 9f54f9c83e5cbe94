"""What both listeners do around a connection: admit, count, and log its end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
import trio

from gateway.server.metrics import Metrics


def peer_name(stream: trio.SocketStream) -> str:
    """``host:port`` of the peer (``[v6]:port``), or ``?`` when the socket can not tell."""
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError, AttributeError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
