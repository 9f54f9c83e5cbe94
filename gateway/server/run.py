"""Starting and stopping one server: the listeners, the HTTP endpoint and the backend.

:func:`open_server` is the one way to start them, used by ``figtank serve``
(:func:`serve_until_signalled`) and by the tests alike::

    async with open_server(settings) as server:
        ...  # server.figg, server.tank, server.metrics: where it listens
    # the end of the block stops it gracefully

``open_server(settings, backend=...)`` serves a backend the caller opened (and closes)
instead of the one the settings select; :func:`run_server` is the same as a task.

Start-up binds every listener before the backend opens; a listener or a data directory
the machine refuses is a :class:`~gateway.core.config.ConfigError` naming the setting.
Before the embedded store opens, :func:`apply_descriptor_limit` raises the soft
descriptor limit to what the data directory and the listeners want (``limits.open_files``).

Shutdown is graceful in three steps: stop accepting connections and tell every open
connection to stop reading (idle ones close at once), give them ``grace`` seconds to finish
what is in flight (appends waiting for their fsync, acknowledgements and responses being
written), then cancel them and close the backend, which fsyncs everything it still holds.
:meth:`ServerInfo.cut_grace` (a second signal) ends the grace period at once.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import structlog
import trio

from gateway.auth.access import Access, load_access
from gateway.auth.guard import AccessGuard
from gateway.auth.policy import PolicyError
from gateway.auth.quotas import QuotaRules, Quotas
from gateway.backend.embedded import EmbeddedSettings, open_embedded_backend
from gateway.core.config import (
    OPTIONS,
    ConfigError,
    ListenerSpec,
    Settings,
    parse_address,
)
from gateway.core.contract import Backend
from gateway.core.metrics import Metrics
from gateway.core.sections import ConnectionLimits
from gateway.http.idempotency import FILE_NAME as IDEMPOTENCY_FILE
from gateway.http.idempotency import IdempotencyKeys, open_idempotency_keys, register_metrics
from gateway.http.idempotency import Limits as IdempotencyLimits
from gateway.kafka.groups.coordinator import GroupCoordinator
from gateway.kafka.groups.lag import CommittedLag
from gateway.kafka.groups.offsets import (
    FILE_NAME,
    OffsetFileError,
    OffsetLimits,
    OffsetStore,
    open_offset_store,
)
from gateway.kafka.groups.settings import GroupSettings
from gateway.kafka.idempotence import ProducerStates
from gateway.kafka.services import (
    NO_GROUPS_UPSTREAM,
    NO_GROUPS_WORKERS,
    KafkaServices,
    fetch_compression,
)
from gateway.kafka.settings import KafkaSettings
from gateway.server.endpoint import Endpoint, serve_endpoint
from gateway.server.listeners import BY_NAME, Shared
from gateway.server.reuseport import shared_sockets
from gateway.serving.accepting import serve_listeners
from gateway.serving.listener import ProtocolListener
from gateway.serving.tls import ListenerTLS
from gateway.store import StoreError
from gateway.store.descriptors import count_partitions, needed_at_start, raise_soft_limit
from gateway.tail.reader import TailReaders
from protocols.native import implementation

log = structlog.get_logger("figtank.server")

Address = tuple[str, int]
#: Why the server can not serve now (``/health`` says it with a 503), or None when it can.
Unavailable = Callable[[], str | None]

_FLAGS = {option.key: option.flag for option in OPTIONS}


class ServerInfo:
    """A started server: where it listens (ports resolved when 0 was asked for), what it
    serves with, and how to stop it."""

    def __init__(self, metrics: Metrics) -> None:
        #: Where every listener listens, by name (``"tank"``, ``"analytics"``...).
        self.addresses: dict[str, Address] = {}
        #: Where the metrics endpoint named metrics listens.
        self.metrics: Address | None = None
        self.backend: Backend | None = None
        #: The protocol listeners serving, by name (``"figg"``, ``"tank"``, and the
        #: [listeners.NAME] ones).
        self.listeners: dict[str, ProtocolListener[Any]] = {}
        #: The access policy in force (``auth.policy_file``), shared by every listener.
        self.guard = AccessGuard(metrics=metrics)
        #: The Kafka consumer groups' coordinator (shared by every Kafka listener; its
        #: ``known`` takes the committed offsets' store).
        self.groups: GroupCoordinator | None = None
        #: The TLS of every TLS listener, by name.
        self.tls: dict[str, ListenerTLS] = {}
        self.metrics_registry = metrics
        #: The quota registry every listener holds; ``quotas.replace_rules`` swaps its
        #: rules (at start-up and on reload of the access policy).
        self.quotas = Quotas(metrics)
        #: The Kafka groups' committed offsets (None without a Kafka listener).
        self.offsets: OffsetStore | None = None
        self._stop = trio.Event()
        self._grace = trio.CancelScope()
        self._grace_cut = False
        self._reloaders: list[tuple[str, Callable[[], None]]] = []

    def __getattr__(self, name: str) -> Address | None:
        """``server.figg``, ``server.tank``, ``server.kafka``, ``server.http``: where the
        listener of that name (a line of the table of listeners) listens; None: off."""
        if name in BY_NAME:
            return self.addresses.get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def add_reloader(self, what: str, reload: Callable[[], None]) -> None:
        """Have :meth:`reload` (SIGHUP) call ``reload()``: it re-reads ``what`` (a
        certificate, the access policy) and raises ``ValueError`` or ``OSError`` when the
        new one is unusable, keeping the one in force."""
        self._reloaders.append((what, reload))

    def reload(self) -> bool:
        """Re-read what can change while serving (what SIGHUP does); each part that fails
        keeps what it had, with one ``reload_failed`` line. True when all succeeded.
        Connections stay open."""
        ok = True
        for what, reload in self._reloaders:
            try:
                reload()
            except (ValueError, OSError) as exc:
                ok = False
                log.error("reload_failed", what=what, error=str(exc), action="kept the "
                          "one in force")
            else:
                log.info("reloaded", what=what)
        return ok

    @property
    def stopping(self) -> bool:
        """True once the shutdown began."""
        return self._stop.is_set()

    def grace_deadline(self) -> float | None:
        """When the grace period ends (trio time; now once it was cut short), or None
        while it has not begun."""
        if self._grace_cut:
            return trio.current_time()
        deadline = self._grace.deadline
        return None if math.isinf(deadline) else deadline

    def request_shutdown(self) -> None:
        """Begin the graceful shutdown (what the first SIGINT or SIGTERM does)."""
        self._stop.set()

    async def wait_shutdown_requested(self) -> None:
        """Return once :meth:`request_shutdown` (or :meth:`cut_grace`) was called."""
        await self._stop.wait()

    def cut_grace(self) -> None:
        """End the grace period now (what a second signal does): open connections are
        cancelled; the backend still closes cleanly and fsyncs what it holds."""
        self._stop.set()
        self._grace_cut = True
        self._grace.cancel()

    async def _hold_connections(self, grace: float, drain: trio.Event, *,
                               task_status: trio.TaskStatus[trio.Nursery]
                               = trio.TASK_STATUS_IGNORED) -> None:
        """Run the connections' handlers in a nursery (given to ``task_status``) until
        ``drain`` is set, then give them ``grace`` seconds to end (less after
        :meth:`cut_grace`) and cancel those still open."""
        with self._grace:
            async with trio.open_nursery() as connections:
                task_status.started(connections)
                await drain.wait()
                if connections.child_tasks:
                    log.info("figtank_stopping", step="finish_in_flight",
                             connections=len(connections.child_tasks), grace_secs=grace)
                self._grace.deadline = min(self._grace.deadline, trio.current_time() + grace)
        if self._grace.cancelled_caught:
            log.warning("figtank_stopping", step="cancel_connections",
                        why="grace cut short" if self._grace_cut else "grace period over")


# ------------------------------------------------------------------------------- start-up


async def bind(key: str, address: str, *, shared: bool = False
               ) -> list[trio.SocketListener]:
    """Listening sockets for ``address``, the value of setting ``key`` (``shared``: with
    ``SO_REUSEPORT``, beside the other workers' sockets); a ConfigError naming the key
    when the machine refuses it (a port in use, an address not here)."""
    host, port = parse_address(address)
    try:
        if shared:
            return [trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                    for sock in shared_sockets(host, port)]
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise listen_error(key, address, exc) from None


def listen_error(key: str, address: str, exc: OSError) -> ConfigError:
    """The ConfigError of a listener ``address`` (setting ``key``) the machine refused."""
    if exc.errno == errno.EADDRINUSE:
        reason = "the address is already in use; stop what holds it or choose"
    else:
        reason = f"{exc.strerror or exc}; choose"
    flag = _FLAGS.get(key)
    how = f"with {flag} HOST:PORT" if flag else f"in {key}"
    return ConfigError(f"{key}: cannot listen on {address}: {reason} another address "
                       f"{how}")


@asynccontextmanager
async def _bind_all(specs: list[ListenerSpec], shared: bool
                    ) -> AsyncIterator[dict[str, list[trio.SocketListener]]]:
    """Every configured listener, by name, bound before anything else starts and closed
    at the end of the block (``shared``: with ``SO_REUSEPORT``, the metrics ones aside)."""
    async with AsyncExitStack() as stack:
        bound: dict[str, list[trio.SocketListener]] = {}
        for spec in specs:
            bound[spec.name] = await bind(spec.key, spec.address,
                                          shared=shared and spec.protocol != "metrics")
            for listener in bound[spec.name]:
                stack.push_async_callback(listener.aclose)
        yield bound


def open_listener_tls(spec: ListenerSpec, settings: Settings, metrics: Metrics
                      ) -> ListenerTLS | None:
    """The TLS of the listener ``spec`` (None: plain); a ConfigError naming the setting
    of its certificate when the files do not load."""
    if spec.tls is None:
        return None
    try:
        return ListenerTLS(spec.name, spec.tls, metrics,
                           timeout=settings.tls_handshake_timeout_secs)
    except ValueError as exc:
        raise ConfigError(f"{spec.tls_key}: {exc}") from None


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


def apply_descriptor_limit(settings: Settings) -> None:
    """Raise the soft RLIMIT_NOFILE to what the store and the listeners want (or to
    ``limits.open_files``); a ConfigError naming ``limits.open_files`` and the number
    needed when the data directory needs more than the process may have."""
    partitions = count_partitions(settings.data_dir)
    connections = settings.connection_slots()
    plan = needed_at_start(partitions, max_open_segments=settings.max_open_segments,
                           connections=connections, open_files=settings.open_files)
    need = (f"the data directory needs {plan.required} descriptors (2 for each of its "
            f"{partitions} partitions + 64)")
    raise_hard = "raise the hard limit (ulimit -Hn, LimitNOFILE= in systemd)"
    if plan.target > plan.hard:
        raise ConfigError(f"limits.open_files: {plan.target} is above the hard descriptor "
                          f"limit {plan.hard}; {raise_hard} or lower limits.open_files")
    if plan.target < plan.required:
        if settings.open_files:
            raise ConfigError(f"limits.open_files: {need}, more than limits.open_files="
                              f"{settings.open_files}; raise it")
        raise ConfigError(f"limits.open_files: {need}, more than the hard descriptor limit "
                          f"(RLIMIT_NOFILE) {plan.hard}; {raise_hard} to {plan.required} "
                          "or more")
    try:
        raise_soft_limit(plan.target)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"limits.open_files: cannot set the descriptor limit to "
                          f"{plan.target}: {exc}") from None
    # debug: a start-up that fails later must still print only its one line
    log.debug("descriptor_limit", soft=plan.target, hard=plan.hard, was=plan.soft,
              required=plan.required, partitions=partitions)


def _data_dir_problem(path: Path, reason: str) -> str:
    return (f"store.data_dir: cannot use {os.fspath(path)!r}: {reason}; choose a directory "
            f"figtank can create and write in with --data-dir DIR")


@asynccontextmanager
async def open_backend(settings: Settings, metrics: Metrics,
                       grace_deadline: Callable[[], float | None] | None = None
                       ) -> AsyncIterator[tuple[Backend, Unavailable]]:
    """The backend the settings select (an upstream broker in bridge mode, else the store)
    and what says why it can not serve now. A data directory that can not be opened is a
    ConfigError naming ``store.data_dir``. ``grace_deadline`` says when the shutdown's
    grace period ends: an upstream Kafka producer flushes what it holds until then."""
    if settings.bridge_mode:
        from gateway.backend.bridge import BridgeSettings, open_bridge_backend

        async with open_bridge_backend(BridgeSettings.of(settings), metrics) as bridge:
            yield bridge, bridge.unavailable
        return
    if settings.upstream_kafka_mode:
        from gateway.backend.kafka import UpstreamKafkaSettings, open_kafka_backend

        async with open_kafka_backend(UpstreamKafkaSettings.of(settings), metrics,
                                      flush_deadline=grace_deadline) as upstream:
            yield upstream, upstream.unavailable
        return
    check_data_dir(settings.data_dir)
    apply_descriptor_limit(settings)
    async with AsyncExitStack() as stack:
        try:
            backend = await stack.enter_async_context(open_embedded_backend(
                EmbeddedSettings.of(settings), metrics,
                connection_slots=settings.connection_slots()))
        except StoreError as exc:  # a file of the store it can not read
            raise ConfigError(f"store.data_dir: {exc}; repair or remove it, or choose "
                              f"another directory with --data-dir DIR") from None
        yield backend, backend.not_writable


def offsets_path(settings: Settings) -> Path | None:
    """Where the committed offsets are kept: ``offsets.file``, else
    ``figtank-offsets.log`` in the data directory; None (in memory) in bridge mode
    without ``offsets.file``."""
    if settings.offsets_file is not None:
        return settings.offsets_file
    return None if settings.bridge_mode else settings.data_dir / FILE_NAME


@asynccontextmanager
async def open_offsets(settings: Settings, metrics: Metrics, backend: Backend,
                       wanted: bool = True) -> AsyncIterator[OffsetStore | None]:
    """The server's committed offsets, and their lag gauges (a ConfigError naming
    ``offsets.file`` when the file can not be used); None unless ``wanted`` (no Kafka
    listener: no offsets file)."""
    if not wanted:
        yield None
        return
    path = offsets_path(settings)
    if path is None:
        log.warning("offsets_in_memory", reason="bridge mode without offsets.file",
                    action="committed offsets are lost when figtank stops")
    limits = OffsetLimits(max_entries=settings.offsets_max_entries,
                          max_bytes=settings.offsets_max_bytes,
                          metadata_max_bytes=settings.offsets_metadata_max_bytes,
                          compact_bytes=settings.offsets_compact_bytes)
    try:
        async with open_offset_store(path, fsync=settings.durability == "fsync",
                                     limits=limits, metrics=metrics) as store, \
                trio.open_nursery() as nursery:
            nursery.start_soon(CommittedLag(store, backend, metrics,
                                            settings.offsets_lag_series).run)
            yield store
            nursery.cancel_scope.cancel()
    except OffsetFileError as exc:
        raise ConfigError(f"offsets.file: {exc}") from None


@asynccontextmanager
async def open_idempotency(settings: Settings, metrics: Metrics, *, durable: bool,
                           wanted: bool) -> AsyncIterator[IdempotencyKeys | None]:
    """The HTTP produces' Idempotency-Key values (:mod:`gateway.http.idempotency`): in the
    data directory when ``durable`` (the embedded store opened here), else in memory; None
    unless ``wanted`` (no HTTP listener). A ConfigError naming ``store.data_dir`` when the
    file can not be used."""
    if not wanted:
        yield None
        return
    limits = IdempotencyLimits(settings.http_idempotency_max_keys,
                               settings.http_idempotency_max_bytes,
                               settings.http_idempotency_ttl_secs)
    path = settings.data_dir / IDEMPOTENCY_FILE if durable else None
    try:
        keys_in_use = open_idempotency_keys(path, limits,
                                            fsync=settings.durability == "fsync",
                                            on_limit=metrics.limit_hit)
        async with keys_in_use as keys:
            register_metrics(keys, metrics)
            yield keys
    except OSError as exc:
        raise ConfigError(f"store.data_dir: cannot use {path}: {exc.strerror or exc}; "
                          f"repair or remove it") from None


@asynccontextmanager
async def _given(backend: Backend) -> AsyncIterator[tuple[Backend, Unavailable]]:
    """A backend the caller opened (and closes), always available."""
    yield backend, lambda: None


class _Readiness:
    """What ``/health`` says: ``starting``, ``stopping``, or why the backend can not serve
    (its upstream is away; the embedded store can not write)."""

    def __init__(self) -> None:
        self.phase = "starting"
        self.unavailable: Unavailable = lambda: None

    def not_ready(self) -> str | None:
        return self.phase if self.phase != "serving" else self.unavailable()


def open_guard(settings: Settings, info: ServerInfo) -> None:
    """Load ``auth.policy_file`` into ``info.guard`` (its ``[[user]]`` entries into
    ``info.guard.users``, its ``[[quota]]`` entries into ``info.quotas``) and have SIGHUP
    reload it; a ConfigError naming the setting when the file is not valid."""
    path = settings.policy_file
    if path is None:
        return

    def apply(access: Access) -> None:
        info.guard.users = access.users  # before the policy: a reload swaps both
        info.guard.tokens = access.tokens
        info.guard.replace(access.policy)
        info.quotas.replace_rules(access.quotas)
        if not access.policy.names_groups:
            log.info("access_policy_groups_open", policy_file=str(path),
                     reason="no rule names groups: every Kafka consumer group is open to "
                     "every principal")

    try:
        apply(load_access(path))
    except PolicyError as exc:
        raise ConfigError(f"auth.policy_file: {exc}") from None

    def reload() -> None:  # a PolicyError (ValueError) keeps the policy in force
        apply(load_access(path))

    info.add_reloader(f"access policy {path}", reload)


# ---------------------------------------------------------------------------------- serving


@asynccontextmanager
async def open_server(settings: Settings, *, backend: Backend | None = None,
                      metrics: Metrics | None = None, grace: float = 2.0,
                      quotas: QuotaRules | None = None, worker: int | None = None
                      ) -> AsyncIterator[ServerInfo]:
    """Start the server the settings describe and yield it once it serves; the end of the
    block (or :meth:`ServerInfo.request_shutdown` beforehand) stops it gracefully.

    ``backend`` serves that open backend instead of opening the one the settings select
    (``metrics`` should then be the registry it counts in). ``quotas``: the quota rules
    in force from the start (:attr:`ServerInfo.quotas` swaps them later). Raises
    :class:`~gateway.core.config.ConfigError` before serving when a listener can not be
    bound or the data directory can not be used. ``worker``: the index of this process
    among the workers of ``figtank serve --workers N`` (:mod:`gateway.server.workers`):
    its protocol listeners share their ports with the others' (``SO_REUSEPORT``) and it
    logs ``worker_serving`` (the supervisor logs ``figtank_serving``).
    """
    info = ServerInfo(metrics or Metrics(settings.metric_topics))
    metrics = info.metrics_registry
    open_guard(settings, info)
    if quotas is not None:
        info.quotas.replace_rules(quotas)
    readiness = _Readiness()
    specs = settings.listener_specs()
    tls = {spec.name: t for spec in specs if (t := open_listener_tls(spec, settings, metrics))}
    info.tls = tls
    for name, listener_tls in tls.items():
        info.add_reloader(f"tls certificate of listener {name}", listener_tls.reload)
    async with _bind_all(specs, shared=worker is not None) as bound, \
            trio.open_nursery() as outer:
        info.addresses = {name: a for name, s in bound.items() if (a := _address_of(s))}
        info.metrics = info.addresses.get("metrics")
        for spec in specs:
            if spec.protocol == "metrics":
                endpoint = Endpoint(metrics, readiness.not_ready,
                                    max_connections=settings.http_max_connections,
                                    timeout=settings.http_timeout_secs,
                                    tls=tls.get(spec.name))
                await outer.start(partial(serve_endpoint, endpoint, bound[spec.name],
                                          name=spec.name))
        info.groups = GroupCoordinator(GroupSettings.of(settings), metrics)
        await outer.start(info.groups.run)
        backend_in_use = (open_backend(settings, metrics, info.grace_deadline)
                          if backend is None else _given(backend))
        kafka = any(spec.protocol == "kafka" for spec in specs)
        groups_refused = (NO_GROUPS_UPSTREAM if settings.upstream_kafka_mode
                          else NO_GROUPS_WORKERS if settings.workers > 1 else None)
        async with backend_in_use as (info.backend, readiness.unavailable), \
                open_offsets(settings, metrics, info.backend,
                             kafka and groups_refused is None) as info.offsets, \
                open_idempotency(settings, metrics,
                                 durable=backend is None and not settings.upstream_mode,
                                 wanted=any(s.protocol == "http" for s in specs)
                                 ) as idempotency, \
                trio.open_nursery() as draining:
            listeners: dict[str, ProtocolListener[Any]] = {}
            services = KafkaServices(
                ProducerStates(settings.max_producer_states, metrics,
                               recovered=getattr(info.backend, "stored_producer", None),
                               first_id=None if worker is None else worker_first_id(worker)),
                info.offsets or OffsetStore(None), info.groups, groups_refused=groups_refused,
                fetch_compression=fetch_compression(KafkaSettings.of(settings)))
            info.groups.known = services.offsets
            limits = ConnectionLimits.of(settings)
            readers = TailReaders(info.backend, metrics)
            shared = Shared(services, idempotency, listeners, readers)
            for spec in specs:
                if (kind := BY_NAME.get(spec.protocol)) is None:
                    continue  # a metrics endpoint, started above
                made = listeners[spec.name] = kind.make(
                    info.backend, settings, metrics, shared, limits=limits, name=spec.name,
                    guard=info.guard, quotas=info.quotas, tls=tls.get(spec.name))
                made.bound(info.addresses[spec.name])
                for what, reload in made.reloaders():
                    info.add_reloader(what, reload)
            info.listeners = listeners
            drain = trio.Event()
            connections = await draining.start(info._hold_connections, grace, drain)
            await draining.start(readers.run)
            for listener in listeners.values():
                await draining.start(listener.run)
            async with trio.open_nursery() as accepting:
                for name, listener in listeners.items():
                    await accepting.start(partial(
                        serve_listeners, listener.handle, bound[name], name=name,
                        metrics=metrics, handler_nursery=connections))
                readiness.phase = "serving"
                if worker is None:
                    log_serving(settings, info)
                else:
                    log_serving(settings, info, "worker_serving", pid=os.getpid())
                yield info
                info.request_shutdown()
                readiness.phase = "stopping"
                log.info("figtank_stopping", step="stop_accepting")
                accepting.cancel_scope.cancel()
            for listener in listeners.values():
                listener.shutdown()
            readers.stop()
            drain.set()
        log.info("figtank_stopping", step="close_backend")
        outer.cancel_scope.cancel()
    log.info("figtank_stopped")


async def run_server(settings: Settings, *, backend: Backend | None = None,
                     grace: float = 2.0, worker: int | None = None,
                     task_status: trio.TaskStatus[ServerInfo] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """:func:`open_server` as a task; ``task_status.started`` gets the server.

    After :meth:`ServerInfo.request_shutdown` it stops gracefully (connections finish what
    is in flight within ``grace``). Cancellation stops it at once: connections are
    cancelled, and the backend still closes cleanly (the store fsyncs what it holds)."""
    async with open_server(settings, backend=backend, grace=grace, worker=worker) as info:
        task_status.started(info)
        await info.wait_shutdown_requested()


def _address_of(listeners: list[trio.SocketListener] | None) -> Address | None:
    if not listeners:
        return None
    bound = listeners[0].socket.getsockname()
    return bound[0], bound[1]


def _show(address: Address | None) -> str | None:
    return None if address is None else f"{address[0]}:{address[1]}"


def worker_first_id(worker: int) -> int:
    """The first Kafka producer id worker ``worker`` hands out: the clock in microseconds,
    as one process's are, in a range of 2**52 of the worker's own, so that workers that
    start in the same moment never hand out the same id (and a client's reconnection to
    another worker is not taken for another producer's)."""
    return (worker << 52) + time.time_ns() // 1000 % (1 << 52)


def log_serving(settings: Settings, info: ServerInfo, event: str = "figtank_serving",
                **more: object) -> None:
    """The structured line saying where a server listens (``more``: further fields)."""
    others = {name: f"{_show(a)}{' tls' if name in info.tls else ''}"
              for name, a in info.addresses.items()
              if name not in BY_NAME and name != "metrics"}
    log.info(event, **{name: _show(info.addresses.get(name)) for name in BY_NAME},
             metrics=_show(info.metrics), listeners=others or None,
             tls=sorted(info.tls) or None,
             backend=("upstream" if settings.bridge_mode else "upstream_kafka"
                      if settings.upstream_kafka_mode else "embedded"),
             upstream=list(settings.upstream) or None,
             upstream_kafka=list(settings.upstream_kafka) or None,
             data_dir=None if settings.upstream_mode else str(settings.data_dir),
             durability=settings.durability, hot_paths=implementation(), **more)


class Signalled(Protocol):
    """What a serving process does on a signal (:func:`follow_signals`)."""

    @property
    def stopping(self) -> bool:
        """Whether a shutdown was asked for already."""

    def reload(self) -> object:
        """Reload what can change while serving (SIGHUP); what it returns is not used."""

    def cut_grace(self) -> None:
        """End the grace period of the shutdown under way now."""


async def follow_signals(signals: AsyncIterator[int], target: Signalled,
                         shutdown: Callable[[], None], **logged: object) -> None:
    """Until ``signals`` end: SIGHUP reloads ``target``; the first SIGINT or SIGTERM calls
    ``shutdown()``, a second one cuts ``target``'s grace period short. Each is logged
    (``signal_received``, the shutdown's line with ``logged``)."""
    async for signum in signals:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            log.info("signal_received", signal=name, action="reload")
            target.reload()
        elif target.stopping:
            log.info("signal_received", signal=name, action="cut_grace")
            target.cut_grace()
        else:
            log.info("signal_received", signal=name, action="shutdown", **logged)
            shutdown()


async def serve_until_signalled(settings: Settings, *, grace: float = 2.0,
                                on_serving: Callable[[ServerInfo], None] | None = None,
                                worker: int | None = None) -> None:
    """Run the server until SIGINT or SIGTERM, then shut it down gracefully; a second
    signal cuts the grace period short. SIGHUP reloads what can change while serving
    (:meth:`ServerInfo.reload`). Returns normally either way. ``on_serving`` is called
    once the server listens; ``worker``: see :func:`open_server`."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            async def serve(task_status: trio.TaskStatus[ServerInfo]) -> None:
                await run_server(settings, grace=grace, worker=worker,
                                 task_status=task_status)
                nursery.cancel_scope.cancel()  # stopped: stop listening for signals

            info: ServerInfo = await nursery.start(serve)
            if on_serving is not None:
                on_serving(info)
            await follow_signals(signals, info, info.request_shutdown, grace_secs=grace)
