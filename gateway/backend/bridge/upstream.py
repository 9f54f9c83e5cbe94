"""The connection to the upstream Tank broker: one client at a time, reconnected forever.

:class:`Upstream` owns the current :class:`~gateway.client.tank.TankClient` (which has no
reconnect of its own). :meth:`Upstream.run` connects to the first address that answers,
trying them in the configured order; when the connection ends it tries again at once, then
with exponential backoff between rounds. It keeps an idle connection alive with a Status
request (a Tank broker closes a connection that sends nothing for 16 s), and reports the
upstream's state: the ``upstream_down`` / ``upstream_up`` log events, the
``figtank_upstream_up`` gauge and the ``figtank_upstream_outages`` counter.

Callers take the client with :meth:`Upstream.wait_client` (waiting, up to a deadline, while
the upstream is away) and hand back one that misbehaved with :meth:`Upstream.discard`.
:meth:`Upstream.call` wraps both: it retries a request on the next connection until a
deadline, so a short outage is only a delay.

Long polls do not travel on that connection. A broker serves a bounded number of requests
per connection at once (figtank: 1024) and stops reading the connection beyond it, so
thousands of parked Consumes would hold up every Produce behind them. ``call(...,
long_poll=True)`` takes a connection from a pool of consume connections to the same
broker instead, opened as needed (:data:`CONSUMES_PER_CONNECTION` long polls each) and
closed with the main connection.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import structlog
import trio

from gateway.client.errors import (
    BadResponse,
    ClientClosed,
    ConnectError,
    ConnectionLost,
    RequestTimeout,
)
from gateway.client.tank import TankClient
from gateway.core.config import parse_address
from gateway.core.contract import UpstreamUnavailable
from gateway.core.metrics import Metrics
from gateway.io.backoff import ExponentialBackoff
from protocols.connection import BROKER_MAX_FRAME

log = structlog.get_logger("figtank.bridge")

T = TypeVar("T")

#: Failures after which a request is worth sending again on the next connection.
RETRYABLE: Final = (ConnectionLost, ClientClosed, RequestTimeout, BadResponse)
#: A connection that lasted this long is redialled at once when it ends.
STABLE_SECS: Final = 1.0
#: Long polls in flight on one consume connection before another one is opened.
CONSUMES_PER_CONNECTION: Final = 256
#: Most consume connections; past it, the least loaded one takes more.
MAX_CONSUME_CONNECTIONS: Final = 32


@dataclass(frozen=True, slots=True)
class Backoff(ExponentialBackoff):
    """Seconds before reconnect round ``attempt``: :class:`ExponentialBackoff` with the
    bridge's defaults, 0 for the first, then 0.1 s doubling up to 5 s (times a jitter in
    ``[0.8, 1.2)``)."""

    base: float = 0.1
    cap: float = 5.0


class Upstream:
    """The upstream broker as one always-reconnecting Tank connection; see the module doc.

    ``addresses`` are ``HOST:PORT`` strings, tried in order. ``request_timeout`` bounds each
    request (a long poll gets its wait on top); a request that times out drops the
    connection, since a broker that stops answering is as good as gone.
    """

    def __init__(self, addresses: Sequence[str], *, metrics: Metrics | None = None,
                 client_id: str = "figtank-bridge", connect_timeout: float = 5.0,
                 request_timeout: float = 30.0, keepalive_secs: float = 5.0,
                 backoff: Callable[[int], float] | None = None,
                 max_frame_size: int = BROKER_MAX_FRAME,
                 consumes_per_connection: int = CONSUMES_PER_CONNECTION,
                 max_consume_connections: int = MAX_CONSUME_CONNECTIONS) -> None:
        if not addresses:
            raise ValueError("bridge mode needs at least one upstream address")
        self.addresses = tuple(addresses)
        self._targets = [parse_address(a) for a in self.addresses]
        self._metrics = metrics
        self.client_id = client_id
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.keepalive_secs = keepalive_secs
        self.backoff = backoff or Backoff()
        self.max_frame_size = max_frame_size
        self.consumes_per_connection = consumes_per_connection
        self.max_consume_connections = max_consume_connections
        self._client: TankClient | None = None
        # The main connection's lifetime: its keepalive and the consume connections.
        self._session: trio.Nursery | None = None
        self._pool: list[TankClient] = []
        self._load: dict[TankClient, int] = {}
        self._opening = trio.Lock()
        self._up_event = trio.Event()
        self._up: bool | None = None  # None until the first connection attempt
        self._down_since = 0.0
        #: Times the upstream became unreachable (also counted in the metrics).
        self.outages = 0
        #: The address of the current connection (None while down).
        self.address: str | None = None
        if metrics is not None:
            metrics.include(metrics.upstream_up, metrics.upstream_outages)
            metrics.upstream_up.set(0)

    @property
    def upstream_up(self) -> bool:
        """True while a connection to an upstream broker is established."""
        client = self._client
        return bool(self._up) and client is not None and client.connected

    # ------------------------------------------------------------------ connection loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Keep a connection until cancelled. ``task_status.started()`` comes after the
        first round of connection attempts, whether or not one succeeded."""
        attempt = 0
        started = False
        self._down_since = trio.current_time()
        try:
            while True:
                delay = self.backoff(attempt)
                if delay > 0:
                    await trio.sleep(delay)
                client, reason = await self._connect_any()
                if client is None:
                    self._went_down(reason)
                else:
                    self._went_up(client)
                if not started:
                    task_status.started()
                    started = True
                if client is None:
                    attempt += 1
                    continue
                connected_at = trio.current_time()
                await self._serve(client)
                self._went_down(repr(client.failure))
                # Redial at once after a connection that lasted; back off from a broker
                # that accepts and then drops us.
                lasted = trio.current_time() - connected_at >= STABLE_SECS
                attempt = 0 if lasted else attempt + 1
        finally:
            self._client = None

    def _new_client(self, host: str, port: int) -> TankClient:
        return TankClient(host, port, client_id=self.client_id,
                          connect_timeout=self.connect_timeout,
                          request_timeout=self.request_timeout,
                          max_frame_size=self.max_frame_size)

    async def _connect_any(self) -> tuple[TankClient | None, str]:
        reasons = []
        for address, (host, port) in zip(self.addresses, self._targets, strict=True):
            client = self._new_client(host, port)
            try:
                await client.connect()
            except ConnectError as exc:
                reasons.append(str(exc))
                continue
            self.address = address
            return client, ""
        return None, "; ".join(reasons)

    async def _serve(self, client: TankClient) -> None:
        async with trio.open_nursery() as session:
            self._session = session
            session.start_soon(self._keepalive, client)
            try:
                await client.serve()
            finally:
                self._session = None
                session.cancel_scope.cancel()  # the consume connections end with it

    async def _pooled(self, host: str, port: int, *,
                      task_status: trio.TaskStatus[TankClient] = trio.TASK_STATUS_IGNORED
                      ) -> None:
        """One consume connection, served until it or the main connection ends."""
        client = self._new_client(host, port)
        await client.connect()
        self._pool.append(client)
        self._load[client] = 0
        try:
            task_status.started(client)
            await client.serve()
        finally:
            self._pool.remove(client)
            self._load.pop(client, None)

    async def _keepalive(self, client: TankClient) -> None:
        if not math.isfinite(self.keepalive_secs) or self.keepalive_secs <= 0:
            return
        while True:
            await trio.sleep(self.keepalive_secs)
            try:
                await client.status()
            except RequestTimeout:
                await self.discard(client, "keepalive Status request timed out")
                return
            except RETRYABLE:
                return  # the connection is ending; run() notices

    def _went_up(self, client: TankClient) -> None:
        self._client = client
        down_for = trio.current_time() - self._down_since
        self._up = True
        if self._metrics is not None:
            self._metrics.upstream_up.set(1)
        log.info("upstream_up", address=self.address, down_secs=round(down_for, 3))
        self._up_event.set()

    def _went_down(self, reason: str) -> None:
        self._client = None
        if self._up is False:
            log.debug("upstream_connect_failed", addresses=list(self.addresses), reason=reason)
            return
        self._up = False
        self._up_event = trio.Event()
        self._down_since = trio.current_time()
        self.outages += 1
        if self._metrics is not None:
            self._metrics.upstream_up.set(0)
            self._metrics.upstream_outages.inc()
        log.warning("upstream_down", address=self.address or list(self.addresses),
                    reason=reason, outages=self.outages)
        self.address = None

    # --------------------------------------------------------------------- for callers

    async def wait_client(self, deadline: float) -> TankClient | None:
        """The connected client, waiting for the upstream until ``deadline`` (trio time);
        None if it is still away then."""
        while True:
            client = self._client
            if client is not None and client.connected:
                return client
            if trio.current_time() >= deadline:
                await trio.lowlevel.checkpoint()
                return None
            event = self._up_event
            if event.is_set():
                # The connection just ended and run() has not noticed yet.
                await trio.sleep(0.005)
                continue
            with trio.move_on_at(deadline):
                await event.wait()

    async def _consume_client(self, deadline: float) -> TankClient | None:
        """A consume connection with room for one more long poll, opening one if needed;
        None if the upstream is away until ``deadline``."""
        main = await self.wait_client(deadline)
        if main is None:
            return None
        best = self._least_loaded()
        if best is not None and self._load[best] < self.consumes_per_connection:
            return best
        async with self._opening:
            best = self._least_loaded()  # another caller may have opened one meanwhile
            if best is not None and self._load[best] < self.consumes_per_connection:
                return best
            session = self._session
            if session is not None and len(self._pool) < self.max_consume_connections:
                try:
                    pooled: TankClient = await session.start(self._pooled, main.host,
                                                             main.port)
                    return pooled
                except (ConnectError, RuntimeError) as exc:  # RuntimeError: session ended
                    log.warning("upstream_consume_connection_failed", address=self.address,
                                error=repr(exc))
        return best or main

    def _least_loaded(self) -> TankClient | None:
        live = [c for c in self._pool if c.connected]
        return min(live, key=self._load.__getitem__) if live else None

    @property
    def consume_connections(self) -> int:
        """Consume connections open now."""
        return len(self._pool)

    async def discard(self, client: TankClient, reason: str) -> None:
        """Drop ``client``'s connection (it timed out or answered nonsense); run() then
        reconnects."""
        if client is self._client and client.connected:
            log.warning("upstream_connection_dropped", address=self.address, reason=reason)
        await client.aclose()

    async def call(self, what: str, deadline: float,
                   request: Callable[[TankClient], Awaitable[T]], *,
                   long_poll: bool = False) -> T:
        """``await request(client)`` on the current connection, again on the next one when
        the connection fails, until ``deadline`` (trio time). ``long_poll`` requests go
        on a consume connection.

        A request that was sent but not answered is sent again: callers use this only
        where a repeat is harmless or at-least-once is the contract. Raises
        :class:`UpstreamUnavailable` at the deadline.
        """
        while True:
            client = await (self._consume_client(deadline) if long_poll
                            else self.wait_client(deadline))
            if client is None:
                raise UpstreamUnavailable(f"{what}: the upstream broker is unreachable")
            pooled = client in self._load
            if pooled:
                self._load[client] += 1
            try:
                return await request(client)
            except (RequestTimeout, BadResponse) as exc:
                await self.discard(client, f"{what}: {exc!r}")
            except (ConnectionLost, ClientClosed):
                pass
            finally:
                if pooled and client in self._load:
                    self._load[client] -= 1
