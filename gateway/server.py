"""One trio nursery that runs the listeners, the metrics endpoint and the shutdown.

Shutdown is graceful in three steps: stop accepting connections, give the open
connections ``grace`` seconds to finish what is in flight (appends waiting for their
fsync, acknowledgements being written), then cancel them and close the backend,
which fsyncs everything it still holds.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import structlog
import trio

from gateway.backend import Backend
from gateway.config import Settings, parse_address
from gateway.embedded import open_embedded_backend
from gateway.figg_listener import FiggListener
from gateway.metrics import Metrics, serve_metrics
from gateway.tank_listener import TankListener

log = structlog.get_logger("figtank.server")

Address = tuple[str, int]


@dataclass(slots=True)
class ServerInfo:
    """Where a started server listens (ports resolved when 0 was asked for)."""

    tank: Address | None = None
    figg: Address | None = None
    metrics: Address | None = None
    backend: Backend | None = None
    metrics_registry: Metrics = field(default_factory=Metrics)
    _stop: trio.Event = field(default_factory=trio.Event)

    def request_shutdown(self) -> None:
        """Begin the graceful shutdown (what SIGTERM does)."""
        self._stop.set()


@asynccontextmanager
async def open_backend(settings: Settings, metrics: Metrics) -> AsyncIterator[Backend]:
    """The backend the settings select: an upstream broker in bridge mode, else the store."""
    if settings.bridge_mode:
        from gateway.bridge import open_bridge_backend  # bridge mode only

        async with open_bridge_backend(settings, metrics) as backend:
            yield backend
    else:
        async with open_embedded_backend(settings, metrics) as backend:
            yield backend


async def _listen(nursery: trio.Nursery, handler_nursery: trio.Nursery, address: str,
                  handler: Callable[[trio.SocketStream], Awaitable[None]]) -> Address:
    host, port = parse_address(address)
    listeners = await nursery.start(
        lambda task_status: trio.serve_tcp(handler, port, host=host,
                                           handler_nursery=handler_nursery,
                                           task_status=task_status))
    bound = listeners[0].socket.getsockname()
    return bound[0], bound[1]


async def run_server(settings: Settings, *, grace: float = 2.0,
                     task_status: trio.TaskStatus[ServerInfo] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """Serve until :meth:`ServerInfo.request_shutdown` (or cancellation), then stop cleanly."""
    info = ServerInfo()
    metrics = info.metrics_registry
    ready = False
    async with trio.open_nursery() as outer:
        if settings.metrics_listen:
            host, port = parse_address(settings.metrics_listen)
            metrics_listeners = await outer.start(serve_metrics, metrics, host, port,
                                                  lambda: ready)
            info.metrics = metrics_listeners[0].socket.getsockname()[:2]
        async with open_backend(settings, metrics) as backend:
            info.backend = backend
            figg = FiggListener(backend, settings, metrics)
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    if settings.tank_listen:
                        tank = TankListener(backend, settings, metrics)
                        info.tank = await _listen(accepting, connections,
                                                  settings.tank_listen, tank.handle)
                    if settings.figg_listen:
                        info.figg = await _listen(accepting, connections,
                                                  settings.figg_listen, figg.handle)
                    ready = True
                    log.info("figtank_serving", tank=_show(info.tank), figg=_show(info.figg),
                             metrics=_show(info.metrics),
                             backend="upstream" if settings.bridge_mode else "embedded",
                             upstream=list(settings.upstream) or None,
                             data_dir=None if settings.bridge_mode else str(settings.data_dir),
                             durability=settings.durability)
                    task_status.started(info)
                    await info._stop.wait()
                    log.info("figtank_stopping", step="stop_accepting")
                    accepting.cancel_scope.cancel()
                ready = False
                with trio.move_on_after(grace):
                    await _wait_until_idle(connections)
                connections.cancel_scope.cancel()
            log.info("figtank_stopping", step="close_backend")
        outer.cancel_scope.cancel()
    log.info("figtank_stopped")


async def _wait_until_idle(nursery: trio.Nursery) -> None:
    # Connections end when their clients leave; give in-flight work the grace period.
    while nursery.child_tasks:
        await trio.sleep(0.05)


def _show(address: Address | None) -> str | None:
    return None if address is None else f"{address[0]}:{address[1]}"


async def serve_until_signalled(settings: Settings, *, grace: float = 2.0) -> None:
    """Run the server until SIGINT or SIGTERM, then shut it down gracefully."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            info: ServerInfo = await nursery.start(
                lambda task_status: run_server(settings, grace=grace, task_status=task_status))
            async for signum in signals:
                log.info("signal_received", signal=signal.Signals(signum).name)
                info.request_shutdown()
                break
