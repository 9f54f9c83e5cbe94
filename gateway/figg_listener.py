"""The Figg listener: serves the Figg protocol over a :class:`~gateway.backend.Backend`.

:func:`serve_figg` binds ``settings.figg_listen`` and serves until cancelled. Each
connection is a :class:`~gateway.figg.session.FiggSession`; publishes from all of them
share one :class:`~gateway.figg.publisher.Publisher`. The listener knows nothing of the
log behind the backend: the embedded store and an upstream broker serve it alike.

Topics: Figg ``name`` is Tank (``name``, 0), ``name/p`` is (``name``, p); offsets are Tank
sequence numbers (:mod:`gateway.offsets`).
"""

from __future__ import annotations

from typing import Any

import structlog
import trio

from gateway.backend import Backend
from gateway.config import Settings
from gateway.figg.publisher import Publisher
from gateway.figg.session import FiggSession
from gateway.listening import ConnectionSlots, open_listeners
from gateway.metrics import Metrics

log = structlog.get_logger("figtank.figg")

PROTOCOL = "figg"
#: Close kinds logged at info level; the others are warnings.
_ROUTINE = frozenset({"eof", "reset", "send_failed", "shutdown"})


class FiggListener:
    """Accepts Figg connections and serves each one.

    Enter it as an async context (``async with FiggListener(...) as figg``), then use
    ``figg.handle`` as a ``serve_tcp`` handler. The context runs the one publisher all
    connections share, so publishes that arrive together on different connections go out
    as one bundle per partition. It must outlive the connections: on exit it lets
    in-flight flushes finish (for at most ``flush_grace`` seconds), then cancels them.
    :meth:`serve` does all of this.
    """

    def __init__(self, backend: Backend, settings: Settings, metrics: Metrics, *,
                 flush_grace: float = 5.0) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.flush_grace = flush_grace
        self._publisher: Publisher | None = None
        self._nursery_manager: Any = None
        self._nursery: trio.Nursery | None = None
        self._slots = ConnectionSlots(PROTOCOL, settings.max_connections, metrics, log,
                                      _ROUTINE)

    @property
    def active(self) -> int:
        """Connections being served."""
        return self._slots.active

    async def __aenter__(self) -> FiggListener:
        if self._nursery_manager is not None:
            raise RuntimeError("this FiggListener is already running")
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        self._publisher = Publisher(self.backend, self._nursery)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        publisher, manager, nursery = self._publisher, self._nursery_manager, self._nursery
        self._publisher = self._nursery_manager = self._nursery = None
        assert publisher is not None and manager is not None and nursery is not None
        with trio.move_on_after(self.flush_grace) as scope:
            scope.shield = True
            while not publisher.idle:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
        return await manager.__aexit__(*exc_info)

    async def serve(self, listeners: list[trio.SocketListener], *,
                    task_status: trio.TaskStatus[list[trio.SocketListener]]
                    = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``listeners`` (closed when done) until cancelled."""
        async with self, trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self.handle, listeners)
            task_status.started(listeners)

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection until it ends, then close it."""
        if self._publisher is None:
            raise RuntimeError("enter the FiggListener (async with) before serving with it")
        await self._slots.serve(
            stream,
            lambda conn_log: FiggSession(stream, backend=self.backend, settings=self.settings,
                                         metrics=self.metrics, publisher=self._publisher,
                                         log=conn_log),
            lambda session: {"received": session.messages_received, "acked": session.published,
                             "bytes_sent": session.bytes_sent})


async def serve_figg(backend: Backend, settings: Settings, metrics: Metrics, *,
                     task_status: trio.TaskStatus[list[trio.SocketListener]]
                     = trio.TASK_STATUS_IGNORED) -> None:
    """Serve Figg on ``settings.figg_listen`` until cancelled.

    ``task_status.started`` receives the bound listeners (so port 0 can be resolved).
    With ``figg_listen`` empty the listener is off: started with ``[]`` and returns.
    """
    if not settings.figg_listen:
        task_status.started([])
        return
    listeners = await open_listeners(settings.figg_listen, PROTOCOL, log)
    await FiggListener(backend, settings, metrics).serve(listeners, task_status=task_status)
