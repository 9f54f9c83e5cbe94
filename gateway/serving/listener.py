"""What a protocol listener is to the server: a connection handler over a backend.

:class:`ProtocolListener` admits each accepted connection (up to
``limits.max_connections``), runs the protocol's session on it and accounts for its end;
:mod:`gateway.server.run` binds the sockets, runs the accept loops and stops the
listeners. A listener knows nothing of the log behind the backend: the embedded store and
an upstream broker serve it alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic

import structlog
import trio

from gateway.auth.guard import OPEN, AccessGuard
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota, Quotas
from gateway.core.contract import Backend
from gateway.core.metrics import Metrics
from gateway.core.sections import ConnectionLimits
from gateway.serving.listening import ConnectionSlots, S
from gateway.serving.tls import ListenerTLS, peer_identity


class ProtocolListener(ABC, Generic[S]):
    """Serves accepted connections of one protocol (:meth:`handle` is the handler of
    :func:`gateway.serving.accepting.serve_listeners`) with its sessions (``S``)."""

    #: The protocol's name in metrics and log lines.
    protocol: ClassVar[str]
    #: Close kinds logged at info level; the others are warnings.
    routine_kinds: ClassVar[frozenset[str]]
    log: ClassVar[structlog.typing.FilteringBoundLogger]

    def __init__(self, backend: Backend, metrics: Metrics, *,
                 limits: ConnectionLimits | None = None, name: str | None = None,
                 guard: AccessGuard | None = None, tls: ListenerTLS | None = None,
                 quotas: Quotas | None = None) -> None:
        #: The listener's name (its principal when no certificate names the client).
        self.name = name or self.protocol
        #: The access policy its sessions enforce.
        self.guard = guard or OPEN
        #: The server's quota registry (shared by its listeners), or None: no quotas.
        self.quotas = quotas
        self.backend = backend
        #: The bounds of its connections (``limits.*``); its own settings are the
        #: subclass's ``settings`` (its section).
        self.limits = limits or ConnectionLimits()
        self.metrics = metrics
        #: Its TLS (None: plain TCP).
        self.tls = tls
        self._slots = ConnectionSlots(self.protocol, self.limits.max_connections, metrics,
                                      self.log, self.routine_kinds, listener=self.name,
                                      tls=tls)

    def bound(self, address: tuple[str, int]) -> None:
        """The server bound the listener's sockets to ``address`` (before it serves);
        nothing to do unless a listener says otherwise (Kafka's advertises it)."""

    def reloaders(self) -> list[tuple[str, Callable[[], None]]]:
        """What SIGHUP should re-read for this listener: (what, reload) pairs, as
        :meth:`~gateway.server.run.ServerInfo.add_reloader` takes them (none unless a
        listener says otherwise)."""
        return []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """The listener's own background work, started before it accepts and stopped
        by :meth:`shutdown` (none unless a listener says otherwise: returns at once)."""
        task_status.started()

    @property
    def active(self) -> int:
        """Connections being served."""
        return self._slots.active

    def shutdown(self) -> None:
        """The server is stopping: every connection stops reading, finishes what is in
        flight and closes (idle ones at once)."""
        self._slots.shutdown()

    def handle(self, stream: trio.SocketStream) -> Awaitable[None]:
        """Serve one accepted connection until it ends, then close it (on a TLS listener:
        after its handshake, in this task): await what this returns. Never raises (except
        Cancelled): a failing connection must not stop the accept loop."""
        if self.quotas is None:
            # Nothing to give back afterwards: the connection's task awaits serve() itself,
            # with no coroutine of ours around it (an idle connection keeps its frames).
            return self._slots.serve(stream, self._start, self.stats)
        return self._handle_with_quotas(stream, self.quotas)

    async def _handle_with_quotas(self, stream: trio.SocketStream, quotas: Quotas) -> None:
        """:meth:`handle`, giving the principal's quota buckets back at the end."""
        start = _StartWithQuota(self, quotas)
        try:
            await self._slots.serve(stream, start, self.stats)
        finally:
            if start.quota is not None:
                quotas.release(start.quota)

    def _start(self, stream: trio.abc.Stream,
               log: structlog.typing.FilteringBoundLogger) -> S:
        """The session for ``stream`` once its principal is known (after a handshake), on
        a server without quotas."""
        return self.session(stream, log, principal=self.principal_of(stream))

    def principal_of(self, stream: trio.abc.Stream) -> Principal:
        """Who the connection on ``stream`` (after its TLS handshake) acts as: this
        listener, and on a mutual-TLS listener the subject of the client's certificate
        (:func:`gateway.serving.tls.subject_identity`)."""
        return Principal(self.name, peer_identity(stream))

    @abstractmethod
    def session(self, stream: trio.abc.Stream,
                log: structlog.typing.FilteringBoundLogger, *, principal: Principal,
                quota: PrincipalQuota | None = None) -> S:
        """The session that serves ``stream`` for ``principal`` under ``quota`` (its
        principal's buckets, None: no quotas); it has ``run()`` and ``shutdown()``."""

    @abstractmethod
    def stats(self, session: S) -> dict[str, Any]:
        """What the ``connection_closed`` log line says of ``session``'s work."""


class _StartWithQuota(Generic[S]):
    """Builds a connection's session once its principal is known (after a handshake),
    with its principal's quota buckets, and keeps them to be given back (one small
    object per connection, where a list and a partial were three)."""

    __slots__ = ("listener", "quota", "quotas")

    def __init__(self, listener: ProtocolListener[S], quotas: Quotas) -> None:
        self.listener = listener
        self.quotas = quotas
        self.quota: PrincipalQuota | None = None

    def __call__(self, stream: trio.abc.Stream,
                 log: structlog.typing.FilteringBoundLogger) -> S:
        listener = self.listener
        principal = listener.principal_of(stream)
        quota = self.quota = self.quotas.acquire(principal)
        return listener.session(stream, log, principal=principal, quota=quota)
