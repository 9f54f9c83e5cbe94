"""The Tank listener: serves the Tank protocol over a :class:`~gateway.backend.Backend`.

:func:`serve_tank` binds ``settings.tank_listen`` and serves until cancelled. Each
connection is a :class:`~gateway.tank.session.TankSession`. The listener knows nothing of
the log behind the backend: the embedded store and an upstream broker serve it alike.

To stop accepting before stopping connections, run :meth:`TankListener.handle` under
``trio.serve_tcp(..., handler_nursery=...)`` with a nursery of your own, cancel the
accept loop first and the handler nursery later.
"""

from __future__ import annotations

import structlog
import trio

from gateway.backend import Backend
from gateway.config import Settings, parse_address
from gateway.metrics import Metrics
from gateway.tank.session import RequestCounter, TankSession

log = structlog.get_logger("figtank.tank")

PROTOCOL = "tank"
#: Close kinds logged at info level; the others are warnings.
_ROUTINE = frozenset({"eof", "reset", "send_failed", "shutdown", "idle"})


class TankListener:
    """Serves accepted Tank connections; see :func:`serve_tank`."""

    def __init__(self, backend: Backend, settings: Settings, metrics: Metrics) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self._counter = RequestCounter(metrics)
        #: Connections being served.
        self.active = 0

    async def serve(self, listeners: list[trio.SocketListener], *,
                    task_status: trio.TaskStatus[list[trio.SocketListener]]
                    = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``listeners`` (closed when done) until cancelled."""
        await trio.serve_listeners(self.handle, listeners, task_status=task_status)

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection until it ends, then close it. Never raises
        (except Cancelled): a failing connection must not stop the accept loop."""
        metrics = self.metrics
        conn_log = log.bind(peer=_peer(stream), protocol=PROTOCOL)
        metrics.connections_accepted.labels(PROTOCOL).inc()
        if self.active >= self.settings.max_connections:
            metrics.connections_closed.labels(PROTOCOL, "limit").inc()
            conn_log.warning("connection_closed", kind="limit",
                             reason=f"over {self.settings.max_connections} connections")
            await trio.aclose_forcefully(stream)
            return
        self.active += 1
        metrics.connections.labels(PROTOCOL).inc()
        session = TankSession(stream, backend=self.backend, settings=self.settings,
                              metrics=metrics, counter=self._counter, log=conn_log)
        kind, reason = "shutdown", "server shutting down"
        try:
            close = await session.run()
            kind, reason = close.kind, close.reason
        except Exception as exc:
            kind, reason = "internal_error", repr(exc)
            conn_log.exception("tank_session_crashed")
        finally:
            self.active -= 1
            metrics.connections.labels(PROTOCOL).dec()
            metrics.connections_closed.labels(PROTOCOL, kind).inc()
            level = conn_log.info if kind in _ROUTINE else conn_log.warning
            level("connection_closed", kind=kind, reason=reason, requests=session.requests,
                  bytes_sent=session.bytes_sent)
            await trio.aclose_forcefully(stream)


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError, AttributeError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_tank(backend: Backend, settings: Settings, metrics: Metrics, *,
                     task_status: trio.TaskStatus[list[trio.SocketListener]]
                     = trio.TASK_STATUS_IGNORED) -> None:
    """Serve Tank on ``settings.tank_listen`` until cancelled.

    ``task_status.started`` receives the bound listeners (so port 0 can be resolved).
    With ``tank_listen`` empty the listener is off: started with ``[]`` and returns.
    """
    if not settings.tank_listen:
        task_status.started([])
        return
    host, port = parse_address(settings.tank_listen)
    listeners = await trio.open_tcp_listeners(port, host=host)
    for listener in listeners:
        log.info("listening", protocol=PROTOCOL, address=listener.socket.getsockname()[:2])
    await TankListener(backend, settings, metrics).serve(listeners, task_status=task_status)
