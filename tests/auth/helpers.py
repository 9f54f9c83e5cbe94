"""An in-process server with an access policy, and extra listeners acting as a named
listener or a certificate identity (as a mutual-TLS listener would make them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from gateway.auth.principal import Principal
from gateway.core.config import Settings
from gateway.core.metrics import Metrics
from gateway.core.sections import ConnectionLimits
from gateway.figg.listener import FiggListener
from gateway.server.listeners import BY_NAME
from gateway.server.run import ServerInfo, open_server
from gateway.serving.listener import ProtocolListener
from gateway.tank.listener import TankListener

LOOPBACK = "127.0.0.1:0"


@dataclass
class Endpoint:
    """Where a listener listens (what tests.figg.helpers.RawPeer.connect takes)."""

    host: str
    port: int


def policy_settings(tmp_path: Path, policy: str, **overrides: Any) -> Settings:
    path = tmp_path / "access.toml"
    path.write_text(policy)
    options: dict[str, Any] = {"data_dir": tmp_path / "data", "durability": "os",
                               "policy_file": path, "tank_listen": LOOPBACK,
                               "figg_listen": LOOPBACK, "metrics_listen": "", "kafka_listen": "",
                               "http_listen": ""}
    options.update(overrides)
    return Settings(**options)


@asynccontextmanager
async def policy_server(tmp_path: Path, policy: str, **overrides: Any
                        ) -> AsyncIterator[tuple[ServerInfo, Settings]]:
    """A server (embedded store in ``tmp_path``) enforcing ``policy`` (the file's text)."""
    settings = policy_settings(tmp_path, policy, **overrides)
    async with open_server(settings, grace=0.2) as info:
        yield info, settings


@asynccontextmanager
async def acting_as(info: ServerInfo, settings: Settings, protocol: str, *, name: str,
                    identity: str | None = None) -> AsyncIterator[Endpoint]:
    """One more ``protocol`` listener of the server, named ``name``, whose connections
    act as ``Principal(name, identity)``, on a loopback port for the block."""
    base: type[ProtocolListener] = TankListener if protocol == "tank" else FiggListener

    class Acting(base):  # type: ignore[valid-type,misc]
        def principal_of(self, stream: trio.abc.Stream) -> Principal:
            return Principal(self.name, identity)

    assert info.backend is not None
    # Its own registry (a second Figg listener's gauges would clash with the first's);
    # refusals still count in the server's, through the guard.
    # A Figg listener follows the server's tail readers, as every Figg listener does.
    shared = {} if protocol == "tank" else {"readers": next(
        made.readers for made in info.listeners.values() if isinstance(made, FiggListener))}
    listener = Acting(info.backend, BY_NAME[protocol].section.of(settings), Metrics(),
                      limits=ConnectionLimits.of(settings), name=name, guard=info.guard,
                      **shared)
    async with trio.open_nursery() as nursery:
        sockets = await nursery.start(partial(trio.serve_tcp, listener.handle, 0,
                                              host="127.0.0.1"))
        host, port = sockets[0].socket.getsockname()[:2]
        yield Endpoint(host, port)
        listener.shutdown()
        nursery.cancel_scope.cancel()


def denied(info: ServerInfo, listener: str, operation: str) -> float:
    """``figtank_access_denied_total{listener,operation}`` of the server."""
    for line in info.metrics_registry.render().decode().splitlines():
        if line.startswith(f'figtank_access_denied_total{{listener="{listener}",'
                           f'operation="{operation}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
