"""The HTTP listener: serves :mod:`gateway.http`'s endpoints over a backend.

Connections are admitted, secured (TLS) and accounted for like every listener's
(:class:`~gateway.serving.listener.ProtocolListener`: ``limits.max_connections``, the
``figtank_connections{protocol="http"}`` gauges, one ``connection_closed`` line each). Its
live subscribers follow the server's tail readers (:class:`~gateway.http.tail.Tails`:
one reader of a partition for every listener's subscribers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
import trio

from gateway.auth.guard import AccessGuard
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota, Quotas
from gateway.core.contract import Backend
from gateway.core.metrics import GaugeCollector, Metrics
from gateway.core.sections import ConnectionLimits
from gateway.http.cors import Cors
from gateway.http.hosts import HostGuard
from gateway.http.idempotency import IdempotencyKeys, Limits
from gateway.http.revocation import OpenStreams
from gateway.http.routing import Router
from gateway.http.session import HttpSession
from gateway.http.settings import HttpSettings
from gateway.http.tail import Tails
from gateway.http.tokens import Tokens
from gateway.logevery import LogEvery
from gateway.serving.listener import ProtocolListener
from gateway.serving.tls import ListenerTLS
from gateway.tail.reader import TailReaders


def build_router() -> Router:
    """Every route of the listener."""
    from gateway.http import console, fetch, overview, produce, sse, topics, websocket

    router = Router()
    router.add("GET", "/topics", topics.list_topics)
    router.add("GET", "/topics/{topic}", topics.describe_topic)
    router.add("POST", "/topics/{topic}", produce.produce)
    router.add("GET", "/topics/{topic}/partitions/{partition}/messages", fetch.fetch)
    router.add("GET", "/topics/{topic}/events", sse.events)
    router.add("GET", "/ws", websocket.upgrade)
    for client in ("/figtank.js", "/figtank.mjs", "/figtank.d.ts"):
        router.add("GET", client, console.client_script)
    router.add("GET", "/", console.index)
    router.add("GET", "/console/{name}", console.asset)
    router.add("GET", "/api/overview", overview.overview)
    return router


class HttpListener(ProtocolListener[HttpSession]):
    """Accepts HTTP connections and serves each one (:class:`HttpSession`)."""

    protocol = "http"
    routine_kinds = frozenset({"eof", "reset", "shutdown", "idle", "stream_end",
                               "send_failed"})
    log = structlog.get_logger("figtank.http")

    def __init__(self, backend: Backend, settings: HttpSettings, metrics: Metrics, *,
                 limits: ConnectionLimits | None = None, name: str | None = None,
                 guard: AccessGuard | None = None, tls: ListenerTLS | None = None,
                 quotas: Quotas | None = None, idempotency: IdempotencyKeys | None = None,
                 readers: TailReaders) -> None:
        super().__init__(backend, metrics, limits=limits, name=name,
                         guard=guard, tls=tls, quotas=quotas)
        #: The listener's settings (``http.*``).
        self.settings = settings
        #: The produces' Idempotency-Key values (shared by the server's HTTP listeners;
        #: in memory when none is given).
        self.idempotency = idempotency if idempotency is not None else IdempotencyKeys(
            None, Limits(settings.idempotency_max_keys,
                         settings.idempotency_max_bytes,
                         settings.idempotency_ttl_secs))
        self.tails = Tails(readers, settings.tail_buffer_bytes)
        self.router = build_router()
        self.hosts = HostGuard(settings.allowed_hosts)
        self.cors = Cors(settings.cors_origins, "https" if tls is not None else "http")
        self.tokens = Tokens(self.guard, settings)
        #: The open SSE streams and WebSockets a reload may end.
        self.open_streams = OpenStreams(self.guard, self.tokens, self.log)
        #: Open streams by kind (``sse``, ``websocket``).
        self.streams: dict[str, int] = {"sse": 0, "websocket": 0}
        #: Refusals for a store that can not write are logged once a minute per error
        #: (a retrying client must not flood the log).
        self.store_fault_log = LogEvery()
        metrics.add_collector(GaugeCollector(
            "figtank_http_streams", "Open Server-Sent Events streams and WebSockets of the "
            "HTTP listener, by listener and kind.", ["listener", "kind"],
            lambda: [([self.name, kind], float(n)) for kind, n in self.streams.items()]))
        metrics.add_collector(GaugeCollector(
            "figtank_http_tails", "Partitions the HTTP listener's live subscribers follow "
            "(each read once for every listener: figtank_tail_readers).", ["listener"],
            lambda: [([self.name], float(len(self.tails)))]))

    def reloaders(self) -> list[tuple[str, Callable[[], None]]]:
        """The JWT key files, when it has any."""
        if not self.tokens.has_keys:
            return []
        return [(f"jwt keys of listener {self.name}", self.reload_keys)]

    def reload_keys(self) -> None:
        """Read the JWT key files again (SIGHUP) and end the open streams whose token no
        longer verifies; a file that can not be read keeps the keys in force."""
        self.tokens.reload()
        self.open_streams.recheck()

    def session(self, stream: trio.abc.Stream, log: structlog.typing.FilteringBoundLogger,
                *, principal: Principal, quota: PrincipalQuota | None = None) -> HttpSession:
        session = HttpSession(stream, self, log, principal)
        session.quota = quota
        return session

    def stats(self, session: HttpSession | None) -> dict[str, Any]:
        if session is None:
            return {}
        return {"requests": session.requests, "refused": session.refused,
                "bytes_sent": session.bytes_sent}
