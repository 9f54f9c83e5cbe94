"""What the request/response listeners (Tank, Kafka) share: requests in flight and the
per-connection budgets that hold the next request back.

A :class:`RequestSession` admits each request of a read against three budgets, counting
each limit that holds the connection back once per episode (``figtank_limit_hits``, a
``connection_held_back`` debug line): the response bytes queued
(``limits.response_buffer_bytes``), the requests being served
(``limits.max_requests_in_flight``) and the produce bytes not yet acknowledged
(``limits.unacked_bytes``, :meth:`RequestSession._unacked_bytes`).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import structlog
import trio
from trio.lowlevel import ParkingLot

from gateway.auth.quotas import PrincipalQuota
from gateway.core.metrics import Metrics
from gateway.core.sections import ConnectionLimits
from gateway.io.writer import FrameWriter
from gateway.serving.session import Session


class Framed(Protocol):
    """A protocol connection as the budgets see it."""

    @property
    def buffered(self) -> int:
        """Bytes of a partial frame held."""
        ...


C = TypeVar("C", bound=Framed)


class RequestSession(Session, Generic[C]):
    """A :class:`Session` serving numbered requests with the shared budgets; subclasses
    set ``_conn`` (their protocol's connection ``C``, whose ``buffered`` counts a partial
    frame) and say what their unacknowledged produce bytes are."""

    __slots__ = ("_conn", "_held_by", "_in_flight", "_last_activity", "_log", "_max_in_flight",
                 "_max_unacked", "_metrics", "_settled", "requests")

    _conn: C

    def __init__(self, stream: trio.abc.Stream, outbox: FrameWriter, *, limits: ConnectionLimits,
                 metrics: Metrics, log: structlog.typing.FilteringBoundLogger,
                 quota: PrincipalQuota | None = None) -> None:
        super().__init__(stream, outbox, frame_timeout=limits.frame_timeout_secs,
                         idle_timeout=limits.idle_timeout_secs, quota=quota)
        self._metrics = metrics
        self._log = log
        self._in_flight = 0
        self._max_in_flight = limits.max_requests_in_flight
        self._max_unacked = limits.unacked_bytes
        #: The limit holding the connection back now (its setting's name), or None.
        self._held_by: str | None = None
        self._settled: ParkingLot | None = None  # made when someone first waits
        self._last_activity = trio.current_time()
        #: Requests received on this connection.
        self.requests = 0

    def _unacked_bytes(self) -> int:
        """Produce bytes received and not yet answered."""
        return 0

    # ------------------------------------------------------------------- admission

    async def _admit_next(self) -> None:
        """Before dispatching the next request of a read: wait until it fits every
        budget (one read can hold thousands of small requests)."""
        if self._must_wait():
            await self._admit()

    def _must_wait(self) -> bool:
        """Whether the next request of a read must wait for a budget (:meth:`_admit`);
        when not, a held-back episode is over. :meth:`_admit_next` without its coroutine,
        for the hot path."""
        if self._spent() is not None:
            return True
        self._held_by = None
        return False

    def _spent(self) -> str | None:
        """The first of the connection's budgets that is spent (its setting), or None."""
        if self._outbox.full:
            return "response_buffer_bytes"
        if self._in_flight >= self._max_in_flight:
            return "max_requests_in_flight"
        if self._unacked_bytes() >= self._max_unacked:
            return "unacked_bytes"
        return None

    async def _admit(self) -> None:
        """Wait until the next request fits every budget; count each limit that holds the
        connection back once per episode."""
        while (limit := self._spent()) is not None:
            if limit != self._held_by:
                self._held_by = limit
                self._metrics.limit_hit(limit)
                self._log.debug("connection_held_back", limit=limit,
                                in_flight=self._in_flight,
                                queued_bytes=self._outbox.queued_bytes,
                                unacked_bytes=self._unacked_bytes())
            if limit == "response_buffer_bytes":
                await self._outbox.wait_writable()
            else:
                await self._settle_lot().park()

    # ----------------------------------------------------------- requests in flight

    def _received_request(self) -> None:
        """Count a request and the activity it is."""
        self.requests += 1
        self._last_activity = trio.current_time()

    def _begin(self) -> None:
        self._in_flight += 1

    def _begin_received(self) -> None:
        """:meth:`_received_request` and :meth:`_begin` without reading the clock: the
        request's activity time is that of the read that brought it (:meth:`_end` stamps
        the time it is answered)."""
        self.requests += 1
        self._in_flight += 1

    def _end(self, count: int = 1) -> None:
        self._in_flight -= count
        self._last_activity = trio.current_time()
        if self._settled is not None:
            self._settled.unpark_all()

    def _settle_lot(self) -> ParkingLot:
        if self._settled is None:
            self._settled = ParkingLot()
        return self._settled

    async def _settle(self) -> None:
        while self._in_flight:
            await self._settle_lot().park()

    def _buffered(self) -> int:
        return int(self._conn.buffered)

    def _request_count(self) -> int:
        return self.requests

    def _busy(self) -> bool:
        return self._in_flight > 0

    def _idle_since(self) -> float:
        return max(self._last_activity, self._last_read)
