"""The real server (:func:`gateway.server.run.open_server`) with one protocol listener on an
ephemeral loopback port, for in-process tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.core.config import Settings
from gateway.core.contract import Backend
from gateway.core.metrics import Metrics
from gateway.server.run import open_server

#: Seconds the tests' servers give open connections at the end of a block.
GRACE = 0.2


@dataclass
class RunningServer:
    """Where a test's listener is, and what it serves with."""

    host: str
    port: int
    backend: Any
    metrics: Metrics
    settings: Settings
    #: The protocol listener serving (a FiggListener or a TankListener).
    listener: Any
    #: The server (its ``reload()`` is what SIGHUP does).
    info: Any = None

    def metric(self, text: str) -> float | None:
        """The value of the exposition line starting with ``text`` (None: absent)."""
        for line in self.metrics.render().decode().splitlines():
            if line.startswith(text + " "):
                return float(line.rsplit(" ", 1)[1])
        return None


@asynccontextmanager
async def listening(protocol: Literal["figg", "tank", "kafka", "http"], backend: Backend | None,
                    settings: Settings, metrics: Metrics | None = None
                    ) -> AsyncIterator[RunningServer]:
    """Serve ``protocol`` on 127.0.0.1 (an ephemeral port) until the block ends, then stop
    gracefully; the other listeners are off. Over ``backend`` when given (``metrics``
    the registry it counts in), else over the one ``settings`` select."""
    listen = {"figg_listen": "", "tank_listen": "", "kafka_listen": "",
              "http_listen": "", "metrics_listen": ""}
    settings = replace(settings, **{**listen, f"{protocol}_listen": "127.0.0.1:0"})
    async with open_server(settings, backend=backend, metrics=metrics, grace=GRACE) as server:
        host, port = getattr(server, protocol)
        yield RunningServer(host, port, server.backend, server.metrics_registry, settings,
                            server.listeners[protocol], server)
