"""One HTTP connection: read a request with h11, route it, answer; keep-alive.

A request's head and body must arrive within ``limits.frame_timeout_secs`` of its first
byte (else 408 and the connection closes), and a connection with no request under way
closes after ``limits.idle_timeout_secs``. A body over ``http.max_body_bytes`` is refused with 413
before it is read (Content-Length) or as soon as it passes the limit (chunked), and the
connection closes. A malformed request is 400 and closes the connection. Every refusal is
an answer ``{"error", "message"}`` and one ``http_request_refused`` log line. Bytes reach
h11 only through :class:`~gateway.http.framing.FramingGuard` (RFC 9112 framing: nothing
after a badly framed request is parsed). A request the backend could not serve because
its upstream is away is 503 ``unavailable`` with ``Retry-After``
(:mod:`gateway.http.outage`), the connection kept.

A handler answers with an :class:`~gateway.http.request.Answer`, or takes the connection
over (an SSE stream, a WebSocket) and returns None: the connection ends after it.
"""

from __future__ import annotations

import math
from http import HTTPStatus
from typing import Final, Protocol

import h11
import structlog
import trio

from gateway.auth.guard import AccessGuard, ConnectionAccess
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota, Quotas
from gateway.core.contract import Backend, BackendUnavailable
from gateway.core.metrics import Metrics
from gateway.core.sections import ConnectionLimits
from gateway.http.cors import Cors
from gateway.http.faults import FAULT_CODES
from gateway.http.framing import FramingGuard
from gateway.http.hosts import HostGuard, is_loopback
from gateway.http.idempotency import IdempotencyKeys
from gateway.http.outage import outage_of, unavailable_error
from gateway.http.request import Answer, HttpError, Request, error_answer
from gateway.http.revocation import OpenStreams
from gateway.http.settings import HttpSettings
from gateway.http.tail import Tails
from gateway.http.tokens import Tokens
from gateway.logevery import LogEvery
from gateway.serving.session import CloseConnection

MAX_HEAD: Final = 16 * 1024
RECEIVE_SIZE: Final = 64 * 1024
#: Socket errors that end a connection quietly.
SOCKET_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class Dispatcher(Protocol):
    """Runs the handler of a request (:class:`~gateway.http.routing.Router`)."""

    async def dispatch(self, session: HttpSession, request: Request) -> Answer | None: ...


class HttpServices(Protocol):
    """What a session and the handlers use of the
    :class:`~gateway.http.listener.HttpListener` serving it (which imports this module:
    a protocol, so that the handlers are typed without an import circle)."""

    backend: Backend
    settings: HttpSettings
    limits: ConnectionLimits
    metrics: Metrics
    guard: AccessGuard
    quotas: Quotas | None
    tokens: Tokens
    hosts: HostGuard
    cors: Cors
    idempotency: IdempotencyKeys
    tails: Tails
    open_streams: OpenStreams
    #: Open streams by kind (``sse``, ``websocket``).
    streams: dict[str, int]
    store_fault_log: LogEvery

    @property
    def router(self) -> Dispatcher: ...


class _Closed(Exception):
    """The client closed the connection (or it broke) while a request was read."""


class HttpSession:
    """Serves one accepted HTTP connection until it closes (see the module doc)."""

    #: Ends after which the peer gets up to a second to read the last answer (a refusal,
    #: a WebSocket close frame) before the connection closes (see close_after_answer).
    DRAIN_ON: frozenset[str] = frozenset({"bad_request", "websocket_close", "unavailable",
                                          "slow", "access_revoked", "token_expired",
                                          "frame_timeout"})

    # Thousands of idle streams each hold one: no per-instance dict.
    __slots__ = ("_closing", "_conn", "_end", "_frame", "_idle", "_max_body", "_on_loopback",
                 "accesses", "bytes_sent", "framing", "listener", "log", "principal", "quota",
                 "refused", "requests", "scope", "stream")

    def __init__(self, stream: trio.abc.Stream, listener: HttpServices,
                 log: structlog.typing.FilteringBoundLogger, principal: Principal) -> None:
        self.stream = stream
        #: The :class:`~gateway.http.listener.HttpListener` serving it.
        self.listener = listener
        self.log = log
        #: Who the connection acts as without a token (its listener, or its certificate).
        self.principal = principal
        self._conn: h11.Connection | None = h11.Connection(
            h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.requests = 0
        self.refused = 0
        self.bytes_sent = 0
        self._closing = False
        self._end: CloseConnection | None = None
        #: The quota buckets of the connection's principal (None: no quotas).
        self.quota: PrincipalQuota | None = None
        #: The policy's view per principal a request acted as (see gateway.http.auth).
        self.accesses: dict[Principal, ConnectionAccess] = {}
        #: Cancelled by shutdown(): around waiting for a request, and around a stream
        #: (a new one each time: :meth:`cancellable`).
        self.scope = trio.CancelScope()
        settings = listener.settings
        self._idle = listener.limits.idle_timeout_secs or math.inf
        self._frame = listener.limits.frame_timeout_secs or math.inf
        self._max_body = settings.max_body_bytes
        #: Checks every byte before h11 reads it.
        self.framing = FramingGuard(self._max_body)
        self._on_loopback: bool | None = None

    @property
    def on_loopback(self) -> bool:
        """Whether the connection was accepted on a loopback address (its socket asked
        once, when first wanted)."""
        if self._on_loopback is None:
            self._on_loopback = is_loopback(self.stream)
        return self._on_loopback

    @property
    def conn(self) -> h11.Connection:
        """The connection's HTTP state (h11), until :meth:`end_http`."""
        if self._conn is None:
            raise RuntimeError("the HTTP exchange of this connection is over")
        return self._conn

    def end_http(self) -> None:
        """The HTTP exchange is over (a WebSocket took the connection): drop its state
        (memory per subscriber)."""
        self._conn = None

    @property
    def closing(self) -> bool:
        """True once the server is stopping."""
        return self._closing

    def shutdown(self) -> None:
        """The server is stopping: end an idle wait or a stream now, and the connection
        after the request under way."""
        self._closing = True
        self.scope.cancel()

    def cancellable(self) -> trio.CancelScope:
        """A new scope that :meth:`shutdown` cancels (cancelled already when closing)."""
        self.scope = trio.CancelScope()
        if self._closing:
            self.scope.cancel()
        return self.scope

    # ---------------------------------------------------------------------- serving

    async def run(self) -> CloseConnection:
        """Serve requests until the connection ends; returns why."""
        try:
            while not self._closing:
                request = None  # stays None when shutdown() cancels the wait at once
                with self.cancellable() as waiting:
                    request = await self._read_request()
                if request is None:
                    if waiting.cancelled_caught:
                        return CloseConnection("shutdown", "server shutting down")
                    return self._end or CloseConnection("eof", "peer closed the connection")
                self.requests += 1
                answer = await self._serve(request)
                if answer is None:  # the handler took the connection over
                    return self._end or CloseConnection("stream_end", "stream ended")
                await self.send_answer(answer, head_only=request.method == "HEAD")
                if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                    return self._end or CloseConnection("eof", "connection: close")
                if not self.framing.next_cycle():
                    return CloseConnection("eof", "bytes after an upgrade not taken")
                self.conn.start_next_cycle()
            return CloseConnection("shutdown", "server shutting down")
        except _Closed:
            return CloseConnection("eof", "peer closed the connection")
        except SOCKET_ERRORS:
            return CloseConnection("reset", "connection broken")
        except h11.LocalProtocolError as exc:
            return CloseConnection("protocol_error", str(exc))

    def ended(self, kind: str, reason: str) -> None:
        """Say why the connection ends (a stream's end), for the closing log line."""
        self._end = CloseConnection(kind, reason)

    async def _serve(self, request: Request) -> Answer | None:
        try:
            return await self.listener.router.dispatch(self, request)
        except HttpError as error:
            return self.refuse(request, error)
        except (BackendUnavailable, BaseExceptionGroup) as exc:
            # Before SOCKET_ERRORS can take it (it is an OSError): the backend's upstream
            # is away, not the client's socket.
            outage = outage_of(exc)
            if outage is None:
                raise
            if self._conn is None or self._conn.our_state is not h11.SEND_RESPONSE:
                self.ended("unavailable", str(outage))  # a stream already answering
                return None
            return self.refuse(request, unavailable_error(str(outage)))

    def refuse(self, request: Request, error: HttpError) -> Answer:
        """The answer to a refused request, counted and logged once."""
        self.refused += 1
        self.listener.metrics.requests.labels("http", error.code, "refused").inc()
        held: int | None = 0
        if error.code in FAULT_CODES:  # a store fault, said once a minute
            held = self.listener.store_fault_log.due(error.code)
        if held is not None:
            self.log.warning("http_request_refused", status=error.status, error=error.code,
                             reason=error.message, method=request.method,
                             path=request.path, **({"held_back": held} if held else {}))
        answer = error_answer(error)
        self.listener.cors.apply(request, answer.headers)
        return answer

    # ---------------------------------------------------------------------- reading

    async def _receive(self) -> None:
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except SOCKET_ERRORS:
            raise _Closed from None
        if not data:
            self.conn.receive_data(b"")  # end of stream
        elif checked := self.framing.feed(data):
            # h11 says bytes; it appends any buffer to its own (no copy made here).
            self.conn.receive_data(checked)  # type: ignore[arg-type]

    async def _next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise HttpError(exc.error_status_hint, "malformed_request", str(exc)
                                ) from None
            if event is h11.NEED_DATA:
                if self.framing.error is not None:  # after every byte before it
                    raise self.framing.error
                await self._receive()
                continue
            return event

    async def _read_request(self) -> Request | None:
        """The next request with its body, or None when the client closed the connection
        (or stayed idle too long). A request the client got wrong is answered here."""
        if not any(self.conn.trailing_data) and not self.framing.holding:  # nothing yet
            with trio.move_on_after(self._idle) as idle:
                try:
                    await self._receive()
                except _Closed:
                    return None
            if idle.cancelled_caught:
                self.ended("idle", f"no request for {self._idle:g} s")
                return None
        request = None
        try:
            with trio.fail_after(self._frame):
                event = await self._next_event()
                if isinstance(event, h11.ConnectionClosed):
                    return None
                assert isinstance(event, h11.Request)
                request = Request.parse(event.method, event.target, event.headers)
                request.body = await self._read_body(request)
        except trio.TooSlowError:
            late = HttpError(408, "request_timeout",
                             f"request not complete within {self._frame:g} s")
            with trio.move_on_after(1):  # a client that reads nothing gets no more time
                await self._refuse_and_close(request or Request("?", "?", {}, {}), late)
            self.ended("frame_timeout", late.message)
            return None
        except HttpError as error:
            if request is None:
                line = self.framing.request_line if error is self.framing.error else None
                method, path = line or ("?", "?")
                request = Request(method, path, {}, {})
            await self._refuse_and_close(request, error)
            return None
        return request

    async def _read_body(self, request: Request) -> bytes:
        length = request.header("content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            self.listener.metrics.limit_hit("http_max_body_bytes")
            raise HttpError(413, "body_too_large",
                            f"body of {length} bytes over the limit of {self._max_body}")
        parts: list[bytes] = []
        size = 0
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self._max_body:
                    self.listener.metrics.limit_hit("http_max_body_bytes")
                    raise HttpError(413, "body_too_large",
                                    f"body over the limit of {self._max_body} bytes")
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise _Closed

    async def _refuse_and_close(self, request: Request, error: HttpError) -> None:
        answer = self.refuse(request, error)
        answer.headers.append((b"connection", b"close"))
        self.ended("bad_request", error.message)
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self.send_answer(answer)

    # ---------------------------------------------------------------------- writing

    async def send(self, data: bytes) -> None:
        """Send bytes as they are (h11 made them)."""
        self.bytes_sent += len(data)
        await self.stream.send_all(data)

    async def send_answer(self, answer: Answer, *, head_only: bool = False) -> None:
        headers = [(b"content-type", answer.content_type),
                   (b"content-length", b"%d" % len(answer.body)), *answer.headers]
        conn = self.conn
        data = conn.send(h11.Response(status_code=answer.status, headers=headers,
                                      reason=_reason(answer.status))) or b""
        if not head_only and answer.body:
            data += conn.send(h11.Data(data=answer.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await self.send(data)

    async def start_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the head of an answer whose body follows in pieces (chunked)."""
        await self.send(self.conn.send(h11.Response(status_code=status, headers=headers,
                                                    reason=_reason(status))) or b"")

    def chunk(self, data: bytes) -> bytes:
        """``data`` framed as a piece of the streamed body."""
        return self.conn.send(h11.Data(data=data)) or b""

    def chunk_parts(self, data: bytes) -> list[bytes]:
        """``data`` framed as a piece of the streamed body, as buffers (``data`` itself
        among them, not copied)."""
        return self.conn.send_with_data_passthrough(h11.Data(data=data)) or []


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
