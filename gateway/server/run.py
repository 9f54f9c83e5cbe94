"""One trio nursery that runs the listeners, the metrics endpoint and the shutdown.

Start-up binds every listener before the backend opens; a listener or a data directory
the machine refuses is a :class:`~gateway.server.config.ConfigError` naming the setting.

Shutdown is graceful in three steps: stop accepting connections and tell every open
connection to stop reading (idle ones close at once), give them ``grace`` seconds to finish
what is in flight (appends waiting for their fsync, acknowledgements and responses being
written), then cancel them and close the backend, which fsyncs everything it still holds.
:meth:`ServerInfo.cut_grace` (a second signal) ends the grace period at once.
"""

from __future__ import annotations

import errno
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

import structlog
import trio

from gateway.backend.contract import Backend
from gateway.backend.embedded import open_embedded_backend
from gateway.figg.listener import FiggListener
from gateway.server.config import OPTIONS, ConfigError, Settings, parse_address
from gateway.server.metrics import Metrics, serve_metrics
from gateway.store import StoreError
from gateway.tank.listener import TankListener

log = structlog.get_logger("figtank.server")

Address = tuple[str, int]
#: Why the server can not serve now (``/health`` says it with a 503), or None when it can.
Unavailable = Callable[[], str | None]

_FLAGS = {option.key: option.flag for option in OPTIONS}


@dataclass(slots=True)
class ServerInfo:
    """Where a started server listens (ports resolved when 0 was asked for)."""

    tank: Address | None = None
    figg: Address | None = None
    metrics: Address | None = None
    backend: Backend | None = None
    metrics_registry: Metrics = field(default_factory=Metrics)
    _stop: trio.Event = field(default_factory=trio.Event)
    _grace: trio.CancelScope = field(default_factory=trio.CancelScope)
    _grace_cut: bool = False

    @property
    def stopping(self) -> bool:
        """True once the shutdown began."""
        return self._stop.is_set()

    def request_shutdown(self) -> None:
        """Begin the graceful shutdown (what the first SIGINT or SIGTERM does)."""
        self._stop.set()

    def cut_grace(self) -> None:
        """End the grace period now (what a second signal does): open connections are
        cancelled; the backend still closes cleanly and fsyncs what it holds."""
        self._stop.set()
        self._grace_cut = True
        self._grace.cancel()


class _Listener(Protocol):
    async def handle(self, stream: trio.SocketStream) -> None: ...

    def shutdown(self) -> None: ...


# ------------------------------------------------------------------------------- start-up


async def bind(key: str, address: str) -> list[trio.SocketListener]:
    """Listening sockets for ``address``, the value of setting ``key``; a ConfigError
    naming the key when the machine refuses it (a port in use, an address not here)."""
    host, port = parse_address(address)
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            reason = "the address is already in use; stop what holds it or choose"
        else:
            reason = f"{exc.strerror or exc}; choose"
        raise ConfigError(f"{key}: cannot listen on {address}: {reason} another address "
                          f"with {_FLAGS[key]} HOST:PORT") from None


async def _bind_all(settings: Settings) -> dict[str, list[trio.SocketListener]]:
    """Every configured listener, bound before anything else starts."""
    wanted = {"listen.metrics": settings.metrics_listen, "listen.tank": settings.tank_listen,
              "listen.figg": settings.figg_listen}
    bound: dict[str, list[trio.SocketListener]] = {}
    try:
        for key, address in wanted.items():
            if address:
                bound[key] = await bind(key, address)
    except BaseException:
        await _close_all(bound)
        raise
    return bound


async def _close_all(bound: dict[str, list[trio.SocketListener]]) -> None:
    with trio.CancelScope(shield=True):
        for listeners in bound.values():
            for listener in listeners:
                await listener.aclose()


def check_data_dir(path: Path) -> None:
    """Create ``path`` if needed and make sure figtank can write in it; a ConfigError
    naming ``store.data_dir`` otherwise."""
    if path.exists() and not path.is_dir():
        raise ConfigError(_data_dir_problem(path, "it is not a directory"))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(_data_dir_problem(path, f"cannot create it: {exc.strerror}")
                          ) from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ConfigError(_data_dir_problem(path, f"cannot write in it: {exc.strerror}")
                          ) from None


def _data_dir_problem(path: Path, reason: str) -> str:
    return (f"store.data_dir: cannot use {os.fspath(path)!r}: {reason}; choose a directory "
            f"figtank can create and write in with --data-dir DIR")


@asynccontextmanager
async def open_backend(settings: Settings, metrics: Metrics
                       ) -> AsyncIterator[tuple[Backend, Unavailable]]:
    """The backend the settings select (an upstream broker in bridge mode, else the store)
    and what says why it can not serve now. A data directory that can not be opened is a
    ConfigError naming ``store.data_dir``."""
    if settings.bridge_mode:
        from gateway.backend.bridge import open_bridge_backend  # bridge mode only

        async with open_bridge_backend(settings, metrics) as bridge:
            yield bridge, bridge.unavailable
        return
    check_data_dir(settings.data_dir)
    async with AsyncExitStack() as stack:
        try:
            backend = await stack.enter_async_context(open_embedded_backend(settings, metrics))
        except StoreError as exc:  # a file of the store it can not read
            raise ConfigError(f"store.data_dir: {exc}; repair or remove it, or choose "
                              f"another directory with --data-dir DIR") from None
        yield backend, lambda: None


# ---------------------------------------------------------------------------------- serving


async def run_server(settings: Settings, *, grace: float = 2.0,
                     task_status: trio.TaskStatus[ServerInfo] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """Serve until :meth:`ServerInfo.request_shutdown` (or cancellation), then stop cleanly.

    Raises :class:`~gateway.server.config.ConfigError` before serving when a listener can not be
    bound or the data directory can not be used.
    """
    info = ServerInfo()
    metrics = info.metrics_registry
    bound = await _bind_all(settings)
    phase = "starting"
    unavailable: Unavailable = lambda: None  # noqa: E731

    def not_ready() -> str | None:
        return phase if phase != "serving" else unavailable()

    try:
        async with trio.open_nursery() as outer:
            if "listen.metrics" in bound:
                info.metrics = _address_of(bound["listen.metrics"])
                await outer.start(serve_metrics, metrics, bound["listen.metrics"], not_ready)
            async with open_backend(settings, metrics) as (backend, unavailable):
                info.backend = backend
                listeners: list[_Listener] = []
                async with trio.open_nursery() as connections:
                    async with trio.open_nursery() as accepting:
                        for key, make in (("listen.tank", TankListener),
                                          ("listen.figg", FiggListener)):
                            if key not in bound:
                                continue
                            listener = make(backend, settings, metrics)
                            listeners.append(listener)
                            await accepting.start(partial(
                                trio.serve_listeners, listener.handle, bound[key],
                                handler_nursery=connections))
                        info.tank = _address_of(bound.get("listen.tank"))
                        info.figg = _address_of(bound.get("listen.figg"))
                        phase = "serving"
                        _log_serving(settings, info)
                        task_status.started(info)
                        await info._stop.wait()
                        phase = "stopping"
                        log.info("figtank_stopping", step="stop_accepting")
                        accepting.cancel_scope.cancel()
                    for listener in listeners:
                        listener.shutdown()
                    await _finish_in_flight(connections, info, grace)
                    connections.cancel_scope.cancel()
                log.info("figtank_stopping", step="close_backend")
            outer.cancel_scope.cancel()
    finally:
        await _close_all(bound)
    log.info("figtank_stopped")


async def _finish_in_flight(connections: trio.Nursery, info: ServerInfo, grace: float
                            ) -> None:
    """Wait until every connection closed, for ``grace`` seconds at most (less after
    :meth:`ServerInfo.cut_grace`)."""
    if connections.child_tasks:
        log.info("figtank_stopping", step="finish_in_flight",
                 connections=len(connections.child_tasks), grace_secs=grace)
    scope = info._grace
    scope.deadline = min(scope.deadline, trio.current_time() + grace)
    with scope:
        while connections.child_tasks:
            await trio.sleep(0.02)
    if connections.child_tasks:
        log.warning("figtank_stopping", step="cancel_connections",
                    connections=len(connections.child_tasks),
                    why="grace cut short" if info._grace_cut else "grace period over")


def _address_of(listeners: list[trio.SocketListener] | None) -> Address | None:
    if not listeners:
        return None
    bound = listeners[0].socket.getsockname()
    return bound[0], bound[1]


def _show(address: Address | None) -> str | None:
    return None if address is None else f"{address[0]}:{address[1]}"


def _log_serving(settings: Settings, info: ServerInfo) -> None:
    log.info("figtank_serving", tank=_show(info.tank), figg=_show(info.figg),
             metrics=_show(info.metrics),
             backend="upstream" if settings.bridge_mode else "embedded",
             upstream=list(settings.upstream) or None,
             data_dir=None if settings.bridge_mode else str(settings.data_dir),
             durability=settings.durability)


async def serve_until_signalled(settings: Settings, *, grace: float = 2.0,
                                on_serving: Callable[[ServerInfo], None] | None = None
                                ) -> None:
    """Run the server until SIGINT or SIGTERM, then shut it down gracefully; a second
    signal cuts the grace period short. Returns normally either way. ``on_serving`` is
    called once the server listens."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def serve(task_status: trio.TaskStatus[ServerInfo]) -> None:
                await run_server(settings, grace=grace, task_status=task_status)
                nursery.cancel_scope.cancel()  # stopped: stop listening for signals

            info: ServerInfo = await nursery.start(serve)
            if on_serving is not None:
                on_serving(info)
            async for signum in signals:
                name = signal.Signals(signum).name
                if info.stopping:
                    log.info("signal_received", signal=name, action="cut_grace")
                    info.cut_grace()
                else:
                    log.info("signal_received", signal=name, action="shutdown",
                             grace_secs=grace)
                    info.request_shutdown()
