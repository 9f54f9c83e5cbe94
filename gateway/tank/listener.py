"""The Tank listener: serves the Tank protocol over a :class:`~gateway.backend.contract.Backend`.

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

from gateway.backend.contract import Backend
from gateway.server.config import Settings
from gateway.server.listening import ConnectionSlots, open_listeners
from gateway.server.metrics import Metrics
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
        self._slots = ConnectionSlots(PROTOCOL, settings.max_connections, metrics, log,
                                      _ROUTINE)

    @property
    def active(self) -> int:
        """Connections being served."""
        return self._slots.active

    def shutdown(self) -> None:
        """The server is stopping: every connection stops reading, finishes what is in
        flight and closes (idle ones at once)."""
        self._slots.shutdown()

    async def serve(self, listeners: list[trio.SocketListener], *,
                    task_status: trio.TaskStatus[list[trio.SocketListener]]
                    = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``listeners`` (closed when done) until cancelled."""
        await trio.serve_listeners(self.handle, listeners, task_status=task_status)

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection until it ends, then close it. Never raises
        (except Cancelled): a failing connection must not stop the accept loop."""
        await self._slots.serve(
            stream,
            lambda conn_log: TankSession(stream, backend=self.backend, settings=self.settings,
                                         metrics=self.metrics, counter=self._counter,
                                         log=conn_log),
            lambda session: {"requests": session.requests, "bytes_sent": session.bytes_sent})


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
    listeners = await open_listeners(settings.tank_listen, PROTOCOL, log)
    await TankListener(backend, settings, metrics).serve(listeners, task_status=task_status)
