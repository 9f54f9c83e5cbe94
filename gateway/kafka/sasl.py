"""SASL on a Kafka listener: SaslHandshake and SaslAuthenticate before anything else.

A listener with ``sasl_mechanisms`` (:class:`~gateway.core.config.ListenerTable`) gives
each connection a :class:`SaslGate`. Until it has authenticated, the connection may send
ApiVersions, one SaslHandshake and the tokens of its mechanism's exchange
(:mod:`gateway.auth.sasl`); anything else closes the connection. After a SaslHandshake
version 1 the tokens travel in SaslAuthenticate requests; after a version 0 (KIP-43: what
clients that do not know SaslAuthenticate send, such as librdkafka without ApiVersions
or told an old ``broker.version.fallback``) they are raw frames, ``int32 size | token``
both ways (:meth:`SaslGate.token`). A mechanism the listener does not enable is answered
UNSUPPORTED_SASL_MECHANISM with the enabled ones, a failed exchange
SASL_AUTHENTICATION_FAILED with the reason (a failed raw exchange gets no answer: Kafka's
SaslServerAuthenticator closes the connection); all then close the connection, count
in ``figtank_sasl_auth_failures{listener,mechanism}`` and log one ``sasl_auth_failed``
line. On success the connection acts as ``user:NAME`` (its principal's
:attr:`~gateway.auth.principal.Principal.user`).

After authentication (and on listeners without SASL) SaslHandshake and SaslAuthenticate
are answered ILLEGAL_SASL_STATE, as Kafka's request handler does (no re-authentication:
the session lifetime answered is 0, "forever").
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
import trio
from prometheus_client import Counter

from gateway.auth.sasl import SaslFailed, SaslServer, server
from gateway.auth.users import Users
from gateway.kafka.context import RequestContext
from gateway.serving.session import CloseConnection
from protocols.kafka.records import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from protocols.kafka.types import ErrorCode


class SaslGate:
    """One connection's SASL exchange on a SASL listener; see the module doc. The session
    hands it SaslHandshake and SaslAuthenticate bodies until :attr:`user` is set."""

    def __init__(self, mechanisms: tuple[str, ...], users: Callable[[], Users], *,
                 listener: str, failures: Counter, limiter: trio.CapacityLimiter,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self._mechanisms = mechanisms
        self._users = users
        self._listener = listener
        self._failures = failures
        self._limiter = limiter
        self._log = log
        self._exchange: SaslServer | None = None
        #: The mechanism picked by the handshake ("" before it).
        self.mechanism = ""
        #: The authenticated user (None until the exchange succeeded).
        self.user: str | None = None
        #: Whether the tokens come as raw frames (the handshake was version 0).
        self.raw = False

    def handshake(self, body: SaslHandshakeRequest, version: int) -> tuple[SaslHandshakeResponse,
                                                          CloseConnection | None]:
        """The answer to a SaslHandshake, and the close that must follow it (or None)."""
        mechanisms = list(self._mechanisms)

        def answer(code: int) -> SaslHandshakeResponse:
            return SaslHandshakeResponse(error_code=code, mechanisms=mechanisms)

        if self._exchange is not None:
            return (answer(ErrorCode.ILLEGAL_SASL_STATE),
                    self.failed(self.mechanism, "a second SaslHandshake"))
        if body.mechanism not in mechanisms:
            return (answer(ErrorCode.UNSUPPORTED_SASL_MECHANISM),
                    self.failed("unsupported", f"mechanism {body.mechanism[:64]!r} is not "
                                f"enabled (enabled: {', '.join(mechanisms)})"))
        self.mechanism = body.mechanism
        self.raw = version == 0
        self._exchange = server(body.mechanism, lambda name: self._users().lookup(name))
        return answer(ErrorCode.NONE), None

    async def authenticate(self, body: SaslAuthenticateRequest) -> tuple[SaslAuthenticateResponse,
                                                     CloseConnection | None]:
        """The answer to a SaslAuthenticate, and the close that must follow it (or None).
        :attr:`user` is set once the exchange has succeeded."""
        if self._exchange is None:
            message = "SaslAuthenticate before SaslHandshake"
            return (SaslAuthenticateResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                                             error_message=message),
                    self.failed("none", message))
        try:
            token = await self._step(body.auth_bytes)
        except SaslFailed as exc:
            return (SaslAuthenticateResponse(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
                                             error_message=str(exc)),
                    self.failed(self.mechanism, _logged(exc), self._exchange.claimed))
        return SaslAuthenticateResponse(error_message=None, auth_bytes=token), None

    async def token(self, data: bytes) -> tuple[bytes, CloseConnection | None]:
        """The answer to a raw SASL token (after a SaslHandshake version 0) and the close
        that must follow it, or None. A failure has no answer (``b""`` with the close: the
        connection is closed without one, as Kafka does). :attr:`user` is set once the
        exchange has succeeded."""
        assert self._exchange is not None and self.raw
        try:
            return await self._step(data), None
        except SaslFailed as exc:
            return b"", self.failed(self.mechanism, _logged(exc), self._exchange.claimed)

    async def _step(self, data: bytes) -> bytes:
        """Feed the exchange one client token: its answer. Raises SaslFailed."""
        exchange = self._exchange
        assert exchange is not None
        if exchange.mechanism == "PLAIN":  # derives a key: PBKDF2, off the event loop
            token = await trio.to_thread.run_sync(exchange.step, data,
                                                  limiter=self._limiter)
        else:
            token = exchange.step(data)
        if exchange.done:
            self.user = exchange.user
            self._log.info("sasl_authenticated", user=self.user, mechanism=self.mechanism,
                           listener=self._listener, raw=self.raw)
        return token

    def failed(self, mechanism: str, reason: str, user: str | None = None
               ) -> CloseConnection:
        """Count and log a failure; the close that ends the connection."""
        self._failures.labels(self._listener, mechanism).inc()
        self._log.warning("sasl_auth_failed", listener=self._listener, mechanism=mechanism,
                          user=user, reason=reason)
        return CloseConnection("sasl_failed", f"SASL authentication failed: {reason}")


def _logged(exc: SaslFailed) -> str:
    """The log's reason: the client's message and what only the log may say."""
    return f"{exc} ({exc.detail})" if exc.detail else str(exc)


async def refuse_handshake(ctx: RequestContext, body: SaslHandshakeRequest, version: int
                           ) -> SaslHandshakeResponse:
    """SaslHandshake on a connection that is not authenticating: ILLEGAL_SASL_STATE."""
    return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])


async def refuse_authenticate(ctx: RequestContext, body: SaslAuthenticateRequest,
                              version: int) -> SaslAuthenticateResponse:
    """SaslAuthenticate on a connection that is not authenticating: ILLEGAL_SASL_STATE."""
    return SaslAuthenticateResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                                    error_message="no SASL exchange on this connection")
