"""The Figg listener: serves the Figg protocol over a :class:`~gateway.core.contract.Backend`.

Each connection is a :class:`~gateway.figg.session.FiggSession`; the server
(:func:`gateway.server.run.open_server`) binds ``listen.figg`` and runs the listener.

Topics: Figg ``name`` is Tank (``name``, 0), ``name/p`` is (``name``, p); offsets are Tank
sequence numbers (:mod:`gateway.figg.offsets`).
"""

from __future__ import annotations

from typing import Any

import structlog
import trio

from gateway.auth.guard import AccessGuard
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota, Quotas
from gateway.core.contract import Backend
from gateway.core.metrics import GaugeCollector, Metrics
from gateway.core.sections import ConnectionLimits
from gateway.figg.feed import TailFeeds
from gateway.figg.frames import DataFrameCache
from gateway.figg.session import FiggSession
from gateway.figg.settings import FiggSettings
from gateway.serving.listener import ProtocolListener
from gateway.serving.tls import ListenerTLS
from gateway.tail.reader import TailReaders


class FiggListener(ProtocolListener[FiggSession]):
    """Accepts Figg connections and serves each one. Its connections share one
    :class:`DataFrameCache`, so subscribers of a topic at the same position get the DATA
    frames made once, and those at the tail follow the server's
    :class:`~gateway.tail.reader.TailReaders` (one reader of a partition for every
    listener: :class:`TailFeeds` are its Figg topic names' feeds)."""

    protocol = "figg"
    routine_kinds = frozenset({"eof", "reset", "send_failed", "shutdown", "idle"})
    log = structlog.get_logger("figtank.figg")

    def __init__(self, backend: Backend, settings: FiggSettings, metrics: Metrics, *,
                 limits: ConnectionLimits | None = None, name: str | None = None,
                 guard: AccessGuard | None = None, tls: ListenerTLS | None = None,
                 quotas: Quotas | None = None, readers: TailReaders,
                 share_with: FiggListener | None = None) -> None:
        super().__init__(backend, metrics, limits=limits, name=name,
                         guard=guard, tls=tls, quotas=quotas)
        #: The listener's settings (``figg.*``).
        self.settings = settings
        self.readers = readers
        #: The feeds of the server's tail readers, by Figg topic name.
        self.feeds = TailFeeds(readers)
        self.frames: DataFrameCache
        if share_with is not None:
            # Another Figg listener of the server: one cache for all, so
            # figg.data_cache_bytes bounds them together.
            self.frames = share_with.frames
            return
        self.frames = DataFrameCache(settings.data_cache_bytes)
        metrics.add_collector(GaugeCollector(
            "figtank_figg_data_cache_bytes",
            "Bytes of DATA frames held for the Figg subscribers at the same position.",
            [], lambda: [([], float(self.frames.size))]))

    def session(self, stream: trio.abc.Stream,
                log: structlog.typing.FilteringBoundLogger, *,
                principal: Principal, quota: PrincipalQuota | None = None
                ) -> FiggSession:
        return FiggSession(stream, backend=self.backend, settings=self.settings,
                           limits=self.limits, metrics=self.metrics, frames=self.frames,
                           readers=self.readers, log=log, principal=principal, guard=self.guard,
                           quota=quota)

    def stats(self, session: FiggSession) -> dict[str, Any]:
        return {"received": session.messages_received, "acked": session.published,
                "bytes_sent": session.bytes_sent}
