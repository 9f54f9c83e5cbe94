"""The Tank listener: serves the Tank protocol over a :class:`~gateway.core.contract.Backend`.

Each connection is a :class:`~gateway.tank.session.TankSession`; the server
(:func:`gateway.server.run.open_server`) binds ``listen.tank`` and runs the listener.
"""

from __future__ import annotations

from typing import Any

import structlog
import trio

from gateway.auth.guard import AccessGuard
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota, Quotas
from gateway.core.contract import Backend
from gateway.core.metrics import Metrics, RequestCounter
from gateway.core.sections import ConnectionLimits
from gateway.serving.listener import ProtocolListener
from gateway.serving.tls import ListenerTLS
from gateway.tank.session import TankSession
from gateway.tank.settings import TankSettings


class TankListener(ProtocolListener[TankSession]):
    """Accepts Tank connections and serves each one; its connections share one
    :class:`RequestCounter`."""

    protocol = "tank"
    routine_kinds = frozenset({"eof", "reset", "send_failed", "shutdown", "idle"})
    log = structlog.get_logger("figtank.tank")

    def __init__(self, backend: Backend, settings: TankSettings, metrics: Metrics, *,
                 limits: ConnectionLimits | None = None, name: str | None = None,
                 guard: AccessGuard | None = None, tls: ListenerTLS | None = None,
                 quotas: Quotas | None = None) -> None:
        super().__init__(backend, metrics, limits=limits, name=name,
                         guard=guard, tls=tls, quotas=quotas)
        #: The listener's settings.
        self.settings = settings
        self.counter = RequestCounter(metrics, "tank")

    def session(self, stream: trio.abc.Stream,
                log: structlog.typing.FilteringBoundLogger, *,
                principal: Principal, quota: PrincipalQuota | None = None
                ) -> TankSession:
        return TankSession(stream, backend=self.backend, settings=self.settings,
                           limits=self.limits, metrics=self.metrics, counter=self.counter, log=log,
                           principal=principal, guard=self.guard, quota=quota)

    def stats(self, session: TankSession) -> dict[str, Any]:
        return {"requests": session.requests, "bytes_sent": session.bytes_sent}
