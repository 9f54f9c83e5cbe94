"""Who an HTTP request acts as, and what the access policy lets it do.

Without a token a request acts as the connection's principal (the listener, or on a
mutual-TLS listener the subject of the client's certificate), as on every other listener.
A ``Authorization: Bearer TOKEN`` header (or ``access_token=`` in the query, for
EventSource and WebSocket, which can not set headers) names a principal through
:class:`~gateway.http.tokens.Tokens`; a token that is not valid is 401. Every check goes
through the server's :class:`~gateway.auth.guard.AccessGuard`, so the topic permissions of
the policy file apply as they do to Figg, Tank and Kafka.

A refusal of the policy is answered as RFC 6750 §3 says (:func:`challenge`, applied by the
router to whatever a handler raised): a request without a token gets 401 with
``WWW-Authenticate: Bearer realm="figtank"`` when the listener takes tokens (``[[token]]``
entries or JWT keys), and 403 ``access_denied`` when it takes none (no token could help);
a request with a valid token gets 403 ``access_denied`` with ``error="insufficient_scope"``.
Endpoints that name no topic (``/topics``, ``/api/overview``, ``GET /ws``) refuse a
principal the policy grants nothing on any topic (:func:`require_some_access`).
"""

from __future__ import annotations

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.auth.principal import Principal
from gateway.core.contract import PartitionInfo, TopicRefused, ensure_topic
from gateway.http.challenge import bearer_challenge, insufficient_scope_challenge
from gateway.http.faults import StoreFaultError
from gateway.http.request import HttpError, Request
from gateway.http.session import HttpSession
from protocols.topics import is_valid_topic_name


def principal_of(session: HttpSession, request: Request) -> Principal:
    """The principal ``request`` acts as (401 for a token that is not valid)."""
    token = bearer_token(request)
    if token is None:
        return session.principal
    return session.listener.tokens.principal(token, session.principal, request)


def bearer_token(request: Request) -> str | None:
    """The bearer token ``request`` carries (header or query), or None; 401 for an
    ``Authorization`` header that is not ``Bearer TOKEN``."""
    header = request.header("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HttpError(401, "bad_authorization", "Authorization must be "
                            "'Bearer TOKEN'", [bearer_challenge()])
        return token.strip()
    return request.query.get("access_token") or None


def access_of(session: HttpSession, request: Request) -> ConnectionAccess:
    """The policy's view for ``request``'s principal (kept per principal on the
    connection, so the answers are cached as on the other listeners)."""
    principal = principal_of(session, request)
    cached = session.accesses.get(principal)
    if cached is None:
        if len(session.accesses) >= 16:
            session.accesses.clear()
        cached = session.accesses[principal] = session.listener.guard.connection(
            principal, session.log)
    return cached


def require(access: ConnectionAccess, topic: str, operation: Operation, request: str) -> None:
    """403 unless ``access`` may do ``operation`` on ``topic`` (counted and logged as on
    the other listeners)."""
    if not access.may(topic, operation):
        access.refused(topic, operation, request, "403")
        raise HttpError(403, "access_denied", f"{access.principal.name} may not "
                        f"{operation.value} {topic!r}")


def require_some_access(session: HttpSession, access: ConnectionAccess, what: str) -> None:
    """403 (a challenge, see :func:`challenge`) when the policy grants ``access``'s
    principal nothing on any topic: ``what`` (an endpoint naming no topic) would show it
    nothing or let it do nothing."""
    policy = session.listener.guard.policy
    if policy is not None and not policy.grants_topics(access.principal):
        raise HttpError(403, "access_denied", f"{access.principal.name} may not {what}")


def takes_tokens(session: HttpSession) -> bool:
    """Whether the listener takes bearer tokens now (``[[token]]`` entries of the policy
    in force, or JWT keys)."""
    return bool(len(session.listener.guard.tokens)) or session.listener.tokens.has_keys


def challenge(session: HttpSession, request: Request, error: HttpError) -> HttpError:
    """``error`` as RFC 6750 wants it answered: a policy refusal (``access_denied``) of a
    request without a token becomes 401 with a ``Bearer realm`` challenge when the
    listener takes tokens; one of a request with a (valid) token gets
    ``error="insufficient_scope"``. Any other error is returned as it is."""
    if error.code != "access_denied" or error.status != 403:
        return error
    try:
        token = bearer_token(request)
    except HttpError as bad:
        return bad
    if token is not None:
        error.headers.append(insufficient_scope_challenge())
        return error
    if not takes_tokens(session):
        return error
    return HttpError(401, "unauthorized", f"a bearer token is needed: {error.message}",
                     [*error.headers, bearer_challenge()])


def check_topic_name(topic: str) -> None:
    if not is_valid_topic_name(topic):
        raise HttpError(400, "invalid_topic", f"invalid topic name {topic!r} (1-64 of "
                        "[A-Za-z0-9_-], not starting or ending with - or _)")


async def partitions_of(session: HttpSession, access: ConnectionAccess, topic: str, request: str
                        ) -> list[PartitionInfo]:
    """The partitions of ``topic``, created first when it is missing and both the backend's
    auto-creation and the policy allow; 404 when it is not there, a
    :class:`~gateway.http.faults.StoreFaultError` when the store could not create it."""
    backend = session.listener.backend
    may_create = access.may(topic, Operation.CREATE)
    try:
        if may_create:
            return await ensure_topic(backend, topic)
        infos = await backend.discover_partitions(topic)
        if infos is None:
            if backend.auto_create.allows(topic):
                require(access, topic, Operation.CREATE, request)
            raise TopicRefused(f"unknown topic {topic!r}")
        return infos
    except TopicRefused as exc:
        if exc.fault:  # the store could not create it: a server fault
            raise StoreFaultError(exc.fault, str(exc)) from None
        raise HttpError(404, "unknown_topic", str(exc)) from None


def partition_param(text: str | None, count: int, topic: str) -> int | None:
    """A ``partition`` parameter checked against the topic (400 / 404)."""
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit():
        raise HttpError(400, "bad_parameter", f"partition must be an integer, got {text!r}")
    partition = int(text)
    if partition >= count:
        raise HttpError(404, "unknown_partition", f"topic {topic!r} has {count} "
                        f"partition{'s' if count != 1 else ''}, not {partition}")
    return partition
