"""Open SSE streams and WebSockets looked at again when what let them in changes.

A stream is admitted once, when it starts; it may then stay open for hours. When the
access policy is reloaded (SIGHUP) or the JWT keys are (:meth:`Tokens.reload
<gateway.http.tokens.Tokens.reload>`), :meth:`OpenStreams.recheck` asks of every open
stream of the listener whether its bearer token still names its user and whether that
principal may still subscribe to each topic it reads. A stream that fails is ended
(:meth:`Revocable.revoke`: an SSE stream ends after an ``event: revoked``, a WebSocket closes
with :data:`REVOKED`), with one ``http_stream_revoked`` log line and one count in
``figtank_access_denied{operation="subscribe"}`` (or ``"token"`` for a token no longer
valid). Streams still allowed are not touched.

Only streams that something could revoke are kept: one with a bearer token, or any when a
policy file is in force.

A stream admitted with a JWT that carries ``exp`` also ends when the token expires, by the
same path (:meth:`Revocable.revoke` with ``expired=True``: an SSE stream ends after an
``event: expired``, a WebSocket closes with :data:`EXPIRED`), with one
``http_stream_expired`` log line: :meth:`OpenStreams.watch_expiry` gives such a stream one
timer (a task of its own nursery, asleep until ``exp``), nothing is checked per message.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final, Protocol

import structlog
import trio

from gateway.auth.guard import AccessGuard
from gateway.auth.policy import Operation
from gateway.auth.principal import Principal
from gateway.http.messages import dumps

#: The WebSocket close code of a stream whose access was revoked (the private range, as
#: 4000 for a subscriber that fell behind; 4003 echoes HTTP's 403).
REVOKED: Final = 4003
#: The WebSocket close code of a stream whose bearer token expired (401's echo): the
#: client may come back with a fresh token.
EXPIRED: Final = 4001


class Revocable(Protocol):
    """An open stream that a change of access can end."""

    #: ``"sse"`` or ``"websocket"`` (for the log line).
    kind: str
    #: Who it acts as.
    principal: Principal
    #: The bearer token it came with (None: the connection's own principal).
    token: str | None

    def topics(self) -> Iterable[str]:
        """The topics it reads now."""

    def revoke(self, reason: str, *, expired: bool = False) -> None:
        """End the stream now, telling the client ``reason`` (synchronous: it only queues
        the last words and cancels the stream); ``expired``: because its token expired
        (``event: expired``, close :data:`EXPIRED`) rather than a reload."""


class TokenCheck(Protocol):
    def user_now(self, token: str) -> str | None: ...

    def expires_at(self, token: str) -> float | None: ...


class OpenStreams:
    """The open streams of one listener; an :class:`~gateway.auth.guard.AccessWatcher`
    of the server's guard."""

    def __init__(self, guard: AccessGuard, tokens: TokenCheck,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self._guard = guard
        self._tokens = tokens
        self._log = log
        self._streams: set[Revocable] = set()
        guard.watch(self)

    def __len__(self) -> int:
        return len(self._streams)

    @contextmanager
    def holding(self, stream: Revocable) -> Iterator[None]:
        """Keep ``stream`` for the block (when anything could revoke it)."""
        if stream.token is None and self._guard.policy is None:
            yield
            return
        self._streams.add(stream)
        try:
            yield
        finally:
            self._streams.discard(stream)

    def access_changed(self) -> None:
        """The policy was reloaded (called by the guard)."""
        self.recheck()

    def recheck(self) -> int:
        """End every stream no longer allowed; how many ended."""
        ended = 0
        for stream in list(self._streams):
            if self._expired(stream):
                self._expire(stream)
                ended += 1
                continue
            why = self._refusal(stream)
            if why is None:
                continue
            label, topic, reason = why
            self._streams.discard(stream)
            self._guard.count_denied(stream.principal.listener, label)
            self._log.warning("http_stream_revoked", stream=stream.kind,
                              identity=stream.principal.name, topic=topic, reason=reason,
                              operation=label)
            stream.revoke(reason)
            ended += 1
        return ended

    def watch_expiry(self, stream: Revocable, nursery: trio.Nursery) -> None:
        """End ``stream`` when its bearer token expires: a task in ``nursery`` (the
        stream's own, cancelled with it) asleep until then; none for a token that does
        not expire."""
        if stream.token is None:
            return
        expires = self._tokens.expires_at(stream.token)
        if expires is not None:
            nursery.start_soon(self._expire_at, stream, expires)

    async def _expire_at(self, stream: Revocable, expires: float) -> None:
        # exp is wall-clock time: sleep for what is left of it now.
        await trio.sleep(max(0.0, expires - time.time()))
        if stream in self._streams:  # not ended by a reload meanwhile
            self._expire(stream)

    def _expired(self, stream: Revocable) -> bool:
        if stream.token is None:
            return False
        expires = self._tokens.expires_at(stream.token)
        return expires is not None and expires <= time.time()

    def _expire(self, stream: Revocable) -> None:
        self._streams.discard(stream)
        self._log.info("http_stream_expired", stream=stream.kind,
                       identity=stream.principal.name)
        stream.revoke(TOKEN_EXPIRED, expired=True)

    def _refusal(self, stream: Revocable) -> tuple[str, str | None, str] | None:
        """(metric label, topic, reason) when ``stream`` may no longer go on."""
        principal = stream.principal
        if stream.token is not None and self._tokens.user_now(stream.token) != principal.user:
            return "token", None, "access revoked: the bearer token is no longer valid"
        policy = self._guard.policy
        if policy is not None:
            for topic in stream.topics():
                if not policy.allows(principal, topic, Operation.SUBSCRIBE):
                    return ("subscribe", topic, f"access revoked: {principal.name} may no "
                            f"longer subscribe to {topic!r}")
        return None


#: Why a stream whose token expired ends (the close reason, the event's message).
TOKEN_EXPIRED: Final = "token expired"


def expired_event(reason: str = TOKEN_EXPIRED) -> bytes:
    """The last SSE event of a stream whose token expired: ``event: expired`` with
    ``{"error": "token_expired", "message"}`` (an EventSource would reconnect with the same
    URL and its expired token, and get 401: a page closes it and opens another with a
    fresh token)."""
    body: dict[str, Any] = {"error": "token_expired", "message": reason}
    return b"event: expired\ndata: " + dumps(body) + b"\n\n"


def revoked_event(reason: str) -> bytes:
    """The last SSE event of a revoked stream: ``event: revoked`` (an EventSource's
    ``message`` handler does not see it; ``addEventListener("revoked")`` does) with the
    refusal as the house's ``{"error", "message"}`` JSON."""
    body: dict[str, Any] = {"error": "access_revoked", "message": reason}
    return b"event: revoked\ndata: " + dumps(body) + b"\n\n"
