"""The Figg listener: serves the Figg protocol over a :class:`~gateway.backend.contract.Backend`.

:func:`serve_figg` binds ``settings.figg_listen`` and serves until cancelled. Each
connection is a :class:`~gateway.figg.session.FiggSession`. The listener knows nothing of
the log behind the backend: the embedded store and an upstream broker serve it alike.

Topics: Figg ``name`` is Tank (``name``, 0), ``name/p`` is (``name``, p); offsets are Tank
sequence numbers (:mod:`gateway.figg.offsets`).
"""

from __future__ import annotations

import structlog
import trio

from gateway.backend.contract import Backend
from gateway.figg.feed import TailFeeds
from gateway.figg.frames import DataFrameCache
from gateway.figg.session import FiggSession
from gateway.server.config import Settings
from gateway.server.listening import ConnectionSlots, open_listeners
from gateway.server.metrics import GaugeCollector, Metrics

log = structlog.get_logger("figtank.figg")

PROTOCOL = "figg"
#: Close kinds logged at info level; the others are warnings.
_ROUTINE = frozenset({"eof", "reset", "send_failed", "shutdown"})


class FiggListener:
    """Accepts Figg connections and serves each one (``handle`` is a ``serve_tcp``
    handler). Its connections share one :class:`DataFrameCache` and the topics'
    :class:`TailFeeds`, so subscribers of a topic at the same position get the DATA frames
    made once, and those at the tail share one reader of the log."""

    def __init__(self, backend: Backend, settings: Settings, metrics: Metrics) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.frames = DataFrameCache(settings.figg_data_cache_bytes)
        self.feeds = TailFeeds()
        metrics.add_collector(GaugeCollector(
            "figtank_figg_data_cache_bytes",
            "Bytes of DATA frames held for the Figg subscribers at the same position.",
            [], lambda: [([], float(self.frames.size))]))
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
            lambda conn_log: FiggSession(stream, backend=self.backend, settings=self.settings,
                                         metrics=self.metrics, frames=self.frames,
                                         feeds=self.feeds, log=conn_log),
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
