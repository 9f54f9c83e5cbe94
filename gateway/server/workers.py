"""``figtank serve --workers N``: a supervisor and N worker processes serving the same
listeners, for bridge and upstream-Kafka modes (a gateway there keeps no log of its own).

The supervisor (the process the user started) reserves every protocol listener's address
(:func:`gateway.server.reuseport.reserve`: the port fixed, an address in use refused
before anything starts), then starts N workers (:mod:`gateway.server.worker`), each of
which binds its own listening sockets on those ports with ``SO_REUSEPORT``: the kernel
spreads new connections over the workers, and every worker serves every listener. The
supervisor serves the metrics listener itself: ``/metrics`` merges what each worker's
private endpoint (loopback, an ephemeral port) renders (:mod:`gateway.server.merging`);
``/health`` is ready while at least one worker serves and every worker serving says it is
ready (each is asked every second).

Workers write their log lines to the supervisor's stderr, each with ``worker`` (its
index). A worker that exits is started again: at once when it had served, else after a
backoff (0.5 s doubling to 30 s); each restart is a ``worker_exited`` line and counts in
``figtank_worker_restarts_total{worker}``. When no worker serves and every one failed to
start :data:`START_ATTEMPTS` times in a row (once, before the gateway first served), the
supervisor gives up: one line, exit status 2 when they all exited on a configuration
error, else 1.

SIGINT or SIGTERM stops every worker gracefully (each gets SIGTERM and its ``--grace``);
a second signal cuts their grace short; a worker still running ``grace`` +
:data:`STOP_MARGIN` seconds after the first is killed. SIGHUP is passed on (each worker
reloads). The workers run in process groups of their own, so a Ctrl-C at a terminal
reaches the supervisor alone, which stops them once; a worker whose supervisor is gone
(killed) stops as on SIGTERM.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final

import structlog
import trio
from prometheus_client import Counter

from gateway.core.config import LISTEN, ListenerSpec, ListenerTable, Settings, parse_address
from gateway.core.metrics import Metrics
from gateway.io.backoff import ExponentialBackoff
from gateway.server.endpoint import Endpoint, serve_endpoint
from gateway.server.merging import MetricsMerger, Source
from gateway.server.reuseport import reserve
from gateway.server.run import (
    ServerInfo,
    bind,
    follow_signals,
    listen_error,
    log_serving,
    open_listener_tls,
)
from gateway.server.worker import WorkerJob

log = structlog.get_logger("figtank.workers")

#: Failed starts in a row of every worker after which the supervisor gives up.
START_ATTEMPTS: Final = 4
#: Seconds before a worker that exited before serving is started again (by failures).
RESTART_BACKOFF: Final = ExponentialBackoff(base=0.5, cap=30.0, jitter=(1.0, 1.0))
#: Seconds past the grace period after which a stopping worker is killed.
STOP_MARGIN: Final = 10.0
#: How often each worker's ``/health`` is asked, and how long an answer may take.
HEALTH_EVERY: Final = 1.0
#: How long a worker's metrics may take to render.
SCRAPE_TIMEOUT: Final = 5.0
#: Where a worker's private metrics endpoint listens.
PRIVATE_METRICS: Final = "127.0.0.1:0"


@dataclass(slots=True)
class Slot:
    """One worker's place: the process running in it now, and how its starts went."""

    index: int
    process: trio.Process | None = None
    #: Set while its process serves (its pid), with its private metrics address.
    source: Source | None = None
    metrics: str | None = None
    #: What its ``/health`` said last: None ready, else why not.
    health: str | None = "starting"
    #: Exits in a row before serving.
    failures: int = 0
    #: The exit status of its last process.
    status: int | None = None


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def worker_settings(settings: Settings, ports: dict[str, int],
                    specs: list[ListenerSpec]) -> Settings:
    """The settings a worker serves: each protocol listener on the port reserved for it
    (``ports``, by listener name), the metrics listeners replaced by one private
    endpoint (plain, on loopback) when there is any."""
    changes: dict[str, object] = {}
    tables = dict(settings.listeners)
    metrics = False
    for spec in specs:
        if spec.protocol == "metrics":
            metrics = True
            if spec.key.startswith("listeners."):
                del tables[spec.name]
            continue
        host, _ = parse_address(spec.address)
        where = _show(host, ports[spec.name])
        if spec.key.startswith("listen."):
            changes[LISTEN[spec.name]] = where
        else:
            tables[spec.name] = replace(tables[spec.name], address=where)
    changes[LISTEN["metrics"]] = PRIVATE_METRICS if metrics else ""
    tables["metrics"] = ListenerTable(tls=False)
    return replace(settings, listeners=tables, **changes)  # type: ignore[arg-type]


class Supervisor:
    """Starts, watches and stops the workers of one gateway."""

    def __init__(self, settings: Settings, job_settings: Settings, grace: float,
                 info: ServerInfo) -> None:
        self.settings = settings
        self.job_settings = job_settings
        self.grace = grace
        self.info = info
        self.slots = [Slot(i) for i in range(settings.workers)]
        self.merger = MetricsMerger()
        self.restarts = Counter("figtank_worker_restarts",
                                "Worker processes started again after they exited, by "
                                "worker.", ["worker"], registry=info.metrics_registry.registry)
        self.phase = "starting"
        self.stopping = False
        #: Set once every worker served or failed its first start.
        self._settled = trio.Event()
        self._stop = trio.Event()
        self._gave_up: int | None = None

    # ----------------------------------------------------------------------- health

    def not_ready(self) -> str | None:
        """What ``/health`` says: None (ready) while some worker serves and every one
        serving says it is ready."""
        if self.phase != "serving":
            return self.phase
        serving = [slot for slot in self.slots if slot.source is not None]
        if not serving:
            return "no worker serving (restarting)"
        for slot in serving:
            if slot.health is not None:
                return f"worker {slot.index}: {slot.health}"
        return None

    async def poll_health(self) -> None:
        """Ask every serving worker's ``/health`` every :data:`HEALTH_EVERY` seconds."""
        while True:
            for slot in self.slots:
                address = slot.metrics
                if slot.source is not None and address is not None:
                    slot.health = await _ask_health(address)
            await trio.sleep(HEALTH_EVERY)

    def render(self) -> bytes:
        """The merged metrics of the serving workers and the supervisor (in a worker
        thread: blocking requests to the workers' endpoints)."""
        texts: dict[Source, str] = {}
        for slot in list(self.slots):
            source, address = slot.source, slot.metrics
            if source is None or address is None:
                continue
            try:
                texts[source] = _get(address, "/metrics", SCRAPE_TIMEOUT)[1]
            except OSError as exc:
                log.warning("worker_scrape_failed", worker=slot.index, pid=source.pid,
                            error=str(exc))
        return self.merger.render(texts, self.info.metrics_registry.render().decode())

    # -------------------------------------------------------------------- lifecycle

    async def run(self, on_serving: Callable[[ServerInfo], None] | None) -> int:
        """Run the workers until a signal stops them all or they fail to start; the
        exit status."""
        async with trio.open_nursery() as nursery:
            for slot in self.slots:
                nursery.start_soon(self._keep, slot)
            await self._settled.wait()
            if not self.stopping and any(slot.source is not None for slot in self.slots):
                self.phase = "serving"
                log_serving(self.settings, self.info, workers=len(self.slots),
                            pids=[s.source.pid for s in self.slots if s.source is not None])
                if on_serving is not None:
                    on_serving(self.info)
            await self._stop.wait()
        if self._gave_up is not None:
            return self._gave_up
        # A worker stopped before it could handle SIGTERM ends with the signal.
        failed = [slot.index for slot in self.slots
                  if slot.status not in (0, None, -signal.SIGTERM)]
        if failed:
            log.error("workers_stopped_with_errors", workers=failed)
            return 1
        log.info("figtank_stopped", workers=len(self.slots))
        return 0

    def _settle(self) -> None:
        if all(slot.source is not None or slot.failures for slot in self.slots):
            self._settled.set()

    async def _keep(self, slot: Slot) -> None:
        """Run a worker in ``slot`` until the gateway stops, starting it again when it
        exits."""
        while not self.stopping:
            if slot.failures:
                delay = RESTART_BACKOFF(slot.failures)
                with trio.move_on_after(delay):
                    await self._stop.wait()
                if self.stopping:
                    break
            served = await self._run_once(slot)
            if self.stopping:
                log.info("worker_stopped", worker=slot.index, status=slot.status)
                break
            slot.failures = 0 if served else slot.failures + 1
            if self._give_up():
                log.error("worker_exited", worker=slot.index, status=slot.status,
                          served=served, action="give_up")
                self._gave_up_now()
                break
            self.restarts.labels(str(slot.index)).inc()
            log.warning("worker_exited", worker=slot.index, status=slot.status,
                        served=served, action="restart",
                        restart_in_secs=RESTART_BACKOFF(slot.failures))
            self._settle()
        self._check_stopped()

    async def _run_once(self, slot: Slot) -> bool:
        """Start a worker in ``slot`` and wait for its exit; whether it served."""
        read, write = os.pipe()
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "gateway.server.worker"], stdin=subprocess.PIPE,
                pass_fds=(write,), process_group=0)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        slot.process = process
        assert process.stdin is not None
        job = WorkerJob(self.job_settings, self.grace, slot.index, write)
        with contextlib.suppress(trio.BrokenResourceError):  # it died: its exit says how
            await process.stdin.send_all(job.encode())
        log.info("worker_started", worker=slot.index, pid=process.pid)
        if self.stopping:
            process.send_signal(signal.SIGTERM)
        report = await _read_report(read)
        if report is not None:
            slot.source = Source(str(slot.index), process.pid)
            slot.metrics = report.get("metrics")
            slot.health = None
            slot.failures = 0
            self._settle()
        slot.status = await process.wait()
        if slot.source is not None:
            self.merger.retire(slot.source)
        slot.process = slot.source = slot.metrics = None
        await process.stdin.aclose()
        return report is not None

    def _attempts(self) -> int:
        """Failed starts in a row of every worker that make the supervisor give up: one
        before the gateway first served (the same mistake would fail again)."""
        return START_ATTEMPTS if self.phase == "serving" else 1

    def _give_up(self) -> bool:
        """Whether nothing serves and every worker failed to start too often."""
        attempts = self._attempts()
        return not self.stopping and all(
            slot.source is None and slot.failures >= attempts for slot in self.slots)

    def _gave_up_now(self) -> None:
        attempts = self._attempts()
        statuses = {slot.status for slot in self.slots}
        self._gave_up = 2 if statuses == {2} else 1
        log.error("workers_failed", workers=len(self.slots), attempts=attempts,
                  statuses=sorted(s for s in statuses if s is not None))
        print(f"figtank: serve failed: every worker ({len(self.slots)}) failed to start "
              f"{attempts} time{'s' if attempts > 1 else ''} in a row (exit status "
              f"{', '.join(str(s) for s in sorted(x for x in statuses if x is not None))});"
              " their lines above say why", file=sys.stderr)
        self.stopping = True
        self._settled.set()
        self._stop_all()

    def _check_stopped(self) -> None:
        if self.stopping and all(slot.process is None for slot in self.slots):
            self._stop.set()

    def _stop_all(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                slot.process.send_signal(signal.SIGTERM)
        self._check_stopped()

    def shutdown(self, nursery: trio.Nursery) -> None:
        """Stop every worker gracefully (the first SIGINT or SIGTERM)."""
        self.stopping = True
        self.phase = "stopping"
        self._settled.set()
        self._stop_all()
        nursery.start_soon(self._kill_late)

    def cut_grace(self) -> None:
        """A second signal: the workers' grace ends now."""
        self._stop_all()

    def reload(self) -> None:
        """SIGHUP: every worker reloads, and the supervisor its metrics listener's TLS."""
        self.info.reload()
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                slot.process.send_signal(signal.SIGHUP)

    async def _kill_late(self) -> None:
        await trio.sleep(self.grace + STOP_MARGIN)
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                log.warning("worker_killed", worker=slot.index, pid=slot.process.pid,
                            reason=f"still running {self.grace + STOP_MARGIN:g} s after "
                            "the stop began")
                slot.process.kill()


async def _read_report(fd: int) -> dict[str, Any] | None:
    """The worker's one report line, or None when it exited without one."""
    data = b""
    async with trio.lowlevel.FdStream(fd) as stream:
        while b"\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return None
            data += chunk
    report = json.loads(data.split(b"\n", 1)[0])
    return report if isinstance(report, dict) else None


def _get(address: str, path: str, timeout: float) -> tuple[int, str]:
    """GET ``path`` from a worker's private endpoint (blocking): status and body."""
    host, port = parse_address(address)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    except http.client.HTTPException as exc:
        raise OSError(str(exc)) from None
    finally:
        connection.close()


async def _ask_health(address: str) -> str | None:
    """A worker's ``/health``: None when ready, else its reason."""
    with trio.move_on_after(HEALTH_EVERY):
        try:
            status, body = await trio.to_thread.run_sync(_get, address, "/health",
                                                         HEALTH_EVERY, abandon_on_cancel=True)
        except OSError as exc:
            return f"no answer ({exc})"
        return None if status == 200 else body.strip() or f"status {status}"
    return "no answer in time"


def _reserve_all(specs: list[ListenerSpec], held: ExitStack) -> dict[str, int]:
    """Reserve every protocol listener's address (closed with ``held``): the ports, by
    listener name; a ConfigError naming the setting when one can not be had."""
    ports: dict[str, int] = {}
    for spec in specs:
        if spec.protocol == "metrics":
            continue
        host, port = parse_address(spec.address)
        try:
            ports[spec.name], sockets = reserve(host, port)
        except OSError as exc:
            raise listen_error(spec.key, spec.address, exc) from None
        for sock in sockets:
            held.callback(sock.close)
    return ports


async def supervise(settings: Settings, *, grace: float = 2.0,
                    on_serving: Callable[[ServerInfo], None] | None = None) -> int:
    """Run ``settings.workers`` workers until SIGINT or SIGTERM (see the module's
    docstring); the exit status. A ConfigError before any starts when a listener's
    address or certificate can not be used."""
    metrics = Metrics(settings.metric_topics)
    info = ServerInfo(metrics)
    specs = settings.listener_specs()
    info.tls = {s.name: t for s in specs if (t := open_listener_tls(s, settings, metrics))}
    with ExitStack() as held, trio.open_signal_receiver(
            signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        ports = _reserve_all(specs, held)
        endpoints = {}
        for spec in specs:
            if spec.protocol == "metrics":
                endpoints[spec.name] = await bind(spec.key, spec.address)
                for listener in endpoints[spec.name]:
                    held.callback(listener.socket.close)
        for spec in specs:
            if spec.name in ports:
                info.addresses[spec.name] = (parse_address(spec.address)[0], ports[spec.name])
            else:
                sockname = endpoints[spec.name][0].socket.getsockname()
                info.addresses[spec.name] = (sockname[0], sockname[1])
            if spec.name in info.tls:
                info.add_reloader(f"tls certificate of listener {spec.name}",
                                  info.tls[spec.name].reload)
        info.metrics = info.addresses.get("metrics")
        supervisor = Supervisor(settings, worker_settings(settings, ports, specs), grace,
                                info)
        async with trio.open_nursery() as nursery:
            for name, listeners in endpoints.items():
                endpoint = Endpoint(metrics, supervisor.not_ready,
                                    max_connections=settings.http_max_connections,
                                    timeout=settings.http_timeout_secs,
                                    tls=info.tls.get(name), render=supervisor.render)
                await nursery.start(partial(serve_endpoint, endpoint, listeners, name=name))
            if endpoints:
                nursery.start_soon(supervisor.poll_health)
            nursery.start_soon(_signals, signals, supervisor, nursery)
            status = await supervisor.run(on_serving)
            nursery.cancel_scope.cancel()
    return status


async def _signals(signals: AsyncIterator[int], supervisor: Supervisor,
                   nursery: trio.Nursery) -> None:
    await follow_signals(signals, supervisor, partial(supervisor.shutdown, nursery),
                         grace_secs=supervisor.grace, workers=len(supervisor.slots))

