"""The HTTP endpoint of a gateway: ``/metrics`` (Prometheus) and ``/health``, on h11.

HTTP/1.1 with keep-alive; GET and HEAD (other methods: 405), the query string ignored
(``/metrics?x=1`` is ``/metrics``), lines ending in CRLF or a bare LF, a malformed request
400, an unknown path 404. What a client can make it spend is bounded:
``limits.http_max_connections`` connections at once (more are closed on accept, counted as
``figtank_limit_hits{limit="http_max_connections"}``), ``limits.http_timeout_secs`` for
each exchange (reading a whole request and writing its answer; an idle keep-alive
connection is closed after as long), a request head of 8 KiB and a body of 64 KiB (it is
read and dropped).

``/metrics`` is rendered in a worker thread, once for all the scrapes that come while it
renders or within a second after (:mod:`gateway.server.rendering`): scrapers, however many,
cost the event loop almost nothing, and every connection sends the same bytes object.
There is no slot kept for ``/health``: the path is only known once a connection is read,
so a reserved slot would be filled by idle connections as well; with renderings shared,
slots turn over in milliseconds, and a refused connection is closed at once (a health
check retries) instead of waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import h11
import structlog
import trio

from gateway.core.metrics import Metrics
from gateway.server.rendering import REUSE_SECS, RenderFailed, SharedRendering
from gateway.serving.accepting import serve_listeners
from gateway.serving.listening import peer_name
from gateway.serving.tls import ListenerTLS

log = structlog.get_logger("figtank.http")

#: Why the server can not serve now (``/health`` answers 503 with it), or None: ready.
NotReady = Callable[[], str | None]

MAX_REQUEST_HEAD: Final = 8192
MAX_REQUEST_BODY: Final = 64 * 1024
_RECEIVE_SIZE: Final = 16 * 1024
#: Bodies up to this size go out in one send with their head; larger ones on their own,
#: so the shared rendering is not copied per connection.
_JOIN_BELOW: Final = 16 * 1024
_PLAIN = b"text/plain; charset=utf-8"
_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
#: Readiness (200 ``ready``, else 503 and why), and liveness (200 while the process runs):
#: the pair Kubernetes probes (``/readyz``, ``/livez``) and the older names.
_HEALTH_PATHS = frozenset({b"/health", b"/health/ready", b"/ready", b"/readyz"})
_LIVE_PATHS = frozenset({b"/health/live", b"/livez"})

Answer = tuple[int, bytes, bytes]  # status, content type, body


class _TooLarge(Exception):
    """The request's body is over :data:`MAX_REQUEST_BODY`."""


class Endpoint:
    """Answers ``/metrics``, ``/health`` and ``/readyz`` (200 ``ready``, else 503 with the
    reason ``not_ready()`` gives: ``starting``, ``stopping``, an unreachable upstream, a
    store that can not write) and ``/livez``, ``/health/live`` (200 while the process runs,
    whatever the disk: a restart would not empty it). A ``/metrics`` rendering serves the
    scrapes of the next ``reuse_secs``; ``render`` makes it (in a worker thread; default:
    ``metrics.render``, the registry of this process)."""

    def __init__(self, metrics: Metrics, not_ready: NotReady, *, max_connections: int,
                 timeout: float, reuse_secs: float = REUSE_SECS,
                 tls: ListenerTLS | None = None,
                 render: Callable[[], bytes] | None = None) -> None:
        self.metrics = metrics
        #: TLS of the endpoint's listener (None: plain HTTP).
        self.tls = tls
        self.not_ready = not_ready
        self.timeout = timeout
        self.rendering = SharedRendering(render or metrics.render, reuse_secs)
        self._slots = trio.CapacityLimiter(max_connections)

    async def answer(self, method: bytes, target: bytes) -> Answer:
        """What a request for ``target`` gets (the body also for HEAD: its length counts)."""
        if method not in (b"GET", b"HEAD"):
            return 405, _PLAIN, b"GET or HEAD only\n"
        path = target.split(b"?", 1)[0]
        if path == b"/metrics":
            return await self._metrics()
        if path in _HEALTH_PATHS:
            reason = self.not_ready()
            return (200, _PLAIN, b"ready\n") if reason is None else (
                503, _PLAIN, f"{reason}\n".encode())
        if path in _LIVE_PATHS:
            return 200, _PLAIN, b"live\n"
        return 404, _PLAIN, b"not found\n"

    async def _metrics(self) -> Answer:
        try:
            return 200, _METRICS_TYPE, await self.rendering.get()
        except RenderFailed:
            pass  # logged by the scrape that rendered
        except Exception as exc:  # a collector's bug: this scrape fails, not the endpoint
            log.error("metrics_render_failed", error=f"{type(exc).__name__}: {exc}")
        return 500, _PLAIN, b"rendering the metrics failed\n"

    async def handle(self, stream: trio.abc.Stream) -> None:
        """Serve one connection until the client closes it, a request fails or time runs
        out; then close it. Never raises (except Cancelled)."""
        try:
            self._slots.acquire_on_behalf_of_nowait(stream)
        except trio.WouldBlock:
            log.warning("http_connection_refused", reason="over the connection limit",
                        limit=self._slots.total_tokens)
            self.metrics.limit_hit("http_max_connections")
            await trio.aclose_forcefully(stream)
            return
        try:
            served = stream
            if self.tls is not None:
                # Within the exchange timeout too: a silent client must not hold a slot.
                secured = None
                with trio.move_on_after(self.timeout):
                    secured = await self.tls.accept(stream, peer_name(stream))
                if secured is None:
                    return
                served = secured
            await self._serve(served, h11.Connection(
                h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD))
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass
        finally:
            self._slots.release_on_behalf_of(stream)
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.abc.Stream, conn: h11.Connection) -> None:
        more = True
        while more:
            more = False  # also when time runs out: the connection is closed
            with trio.move_on_after(self.timeout):
                more = await self._exchange(stream, conn)

    async def _exchange(self, stream: trio.abc.Stream, conn: h11.Connection) -> bool:
        """Read one request and answer it; True when the connection may serve another."""
        try:
            request = await _read_request(stream, conn)
        except h11.RemoteProtocolError as exc:
            await _send(stream, conn, (exc.error_status_hint, _PLAIN,
                                       f"bad request: {exc}\n".encode()), close=True)
            return False
        except _TooLarge:
            await _send(stream, conn, (413, _PLAIN, b"request body too large\n"), close=True)
            return False
        if request is None:  # the client closed the connection
            return False
        await _send(stream, conn, await self.answer(request.method, request.target),
                    head=request.method == b"HEAD")
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False  # the client asked to close, or spoke HTTP/1.0
        conn.start_next_cycle()
        return True


async def _read_request(stream: trio.abc.Stream, conn: h11.Connection
                        ) -> h11.Request | None:
    """The next whole request (its body read and dropped), or None when the client closed
    the connection."""
    request: h11.Request | None = None
    body = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            # h11 says bytes; it appends any buffer to its own.
            conn.receive_data(await stream.receive_some(_RECEIVE_SIZE))  # type: ignore[arg-type]
        elif isinstance(event, h11.Request):
            # h11 bounds a head that arrives in parts; this, one that came whole.
            size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
            if size > MAX_REQUEST_HEAD:
                raise h11.RemoteProtocolError("request head too large", 431)
            request = event
        elif isinstance(event, h11.Data):
            body += len(event.data)
            if body > MAX_REQUEST_BODY:
                raise _TooLarge
        elif isinstance(event, h11.EndOfMessage):
            return request
        else:  # ConnectionClosed (PAUSED does not happen: a cycle ends at EndOfMessage)
            return None


async def _send(stream: trio.abc.Stream, conn: h11.Connection, answer: Answer, *,
                head: bool = False, close: bool = False) -> None:
    """Send ``answer`` (its headers only for HEAD); ``close``: with ``Connection: close``
    (a refused request: the connection ends after it)."""
    status, content_type, body = answer
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    if status == 405:
        headers.append((b"allow", b"GET, HEAD"))
    if close:
        headers.append((b"connection", b"close"))
    data = conn.send(h11.Response(status_code=status, headers=headers)) or b""
    if not head:
        if len(body) < _JOIN_BELOW:
            data += conn.send(h11.Data(data=body)) or b""
        else:
            await stream.send_all(data)
            for chunk in conn.send_with_data_passthrough(h11.Data(data=body)) or ():
                await stream.send_all(chunk)
            data = b""
    data += conn.send(h11.EndOfMessage()) or b""
    if data:
        await stream.send_all(data)


async def serve_endpoint(endpoint: Endpoint, listeners: list[trio.SocketListener], *,
                         name: str = "metrics",
                         task_status: trio.TaskStatus[Sequence[trio.SocketListener]]
                         = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``endpoint`` on ``listeners`` (the listener ``name``) until cancelled."""
    await serve_listeners(endpoint.handle, listeners, name=name, metrics=endpoint.metrics,
                          task_status=task_status)
