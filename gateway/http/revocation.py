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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final, Protocol

import structlog

from gateway.auth.guard import AccessGuard
from gateway.auth.policy import Operation
from gateway.auth.principal import Principal
from gateway.http.messages import dumps

#: The WebSocket close code of a stream whose access was revoked (the private range, as
#: 4000 for a subscriber that fell behind; 4003 echoes HTTP's 403).
REVOKED: Final = 4003


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

    def revoke(self, reason: str) -> None:
        """End the stream now, telling the client ``reason`` (synchronous: it only queues
        the last words and cancels the stream)."""


class TokenCheck(Protocol):
    def user_now(self, token: str) -> str | None: ...


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


def revoked_event(reason: str) -> bytes:
    """The last SSE event of a revoked stream: ``event: revoked`` (an EventSource's
    ``message`` handler does not see it; ``addEventListener("revoked")`` does) with the
    refusal as the house's ``{"error", "message"}`` JSON."""
    body: dict[str, Any] = {"error": "access_revoked", "message": reason}
    return b"event: revoked\ndata: " + dumps(body) + b"\n\n"
