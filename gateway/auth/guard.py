"""Enforcing the access policy: the server's :class:`AccessGuard` and each connection's
:class:`ConnectionAccess`.

The guard holds the policy in force (None without ``auth.policy_file``: everything is
allowed and no check costs more than that None test) and a generation number that a
reload (SIGHUP) increments. A connection asks its :class:`ConnectionAccess`, which keeps
the answers per (topic, operation) until the generation changes, so a publish batch or a
Consume costs one dict lookup per topic. Each refusal counts in
``figtank_access_denied{listener,operation}`` and logs one ``access_denied`` line, at
most once per (topic, operation) and policy generation on a connection and at most
:data:`LOGGED_REFUSALS` lines per connection and generation (a client can not flood the
log by retrying).
"""

from __future__ import annotations

import weakref
from typing import Final, Protocol

import structlog
from prometheus_client import Counter

from gateway.auth.policy import Operation, Policy
from gateway.auth.principal import Principal
from gateway.auth.tokens import NO_TOKENS, StaticTokens
from gateway.auth.users import NO_USERS, Users

#: Answers (and topics known to exist) one connection keeps; more start the cache over.
CACHE_ENTRIES: Final = 1024
#: ``access_denied`` lines one connection logs per policy generation.
LOGGED_REFUSALS: Final = 32


class AccessWatcher(Protocol):
    """Something holding a permission for a long time (a Figg connection's subscriptions)
    that must look again when the policy changes."""

    def access_changed(self) -> None: ...


class AccessGuard:
    """The policy in force for a server, and what a reload changes."""

    def __init__(self, policy: Policy | None = None, metrics: object | None = None) -> None:
        #: The policy in force; None: no policy file (everything allowed).
        self.policy = policy
        #: Incremented by each :meth:`replace`: connections drop their cached answers.
        self.generation = 0
        #: The SASL users of the policy file (replaced with it on reload).
        self.users: Users = NO_USERS
        #: The HTTP bearer tokens of the policy file (replaced with it on reload).
        self.tokens: StaticTokens = NO_TOKENS
        #: ``figtank_access_denied``, when ``metrics`` (a server's Metrics) has it.
        self._denied: Counter | None = getattr(metrics, "access_denied", None)
        self._watchers: weakref.WeakSet[AccessWatcher] = weakref.WeakSet()

    def replace(self, policy: Policy) -> None:
        """Put ``policy`` in force: the next request of every connection is decided by
        it, and the watchers (live subscriptions) look again at once."""
        self.policy = policy
        self.generation += 1
        for watcher in list(self._watchers):
            watcher.access_changed()

    def watch(self, watcher: AccessWatcher) -> None:
        """Call ``watcher.access_changed()`` after each :meth:`replace` (held weakly)."""
        self._watchers.add(watcher)

    def connection(self, principal: Principal,
                   log: structlog.typing.FilteringBoundLogger) -> ConnectionAccess:
        """The checker of one connection acting as ``principal``."""
        return ConnectionAccess(self, principal, log)

    def count_denied(self, listener: str, operation: str) -> None:
        """One more refusal in ``figtank_access_denied``."""
        if self._denied is not None:
            self._denied.labels(listener, operation).inc()


#: A guard without a policy (everything allowed), for sessions built without one.
OPEN: Final = AccessGuard()


class ConnectionAccess:
    """One connection's view of the policy: cached answers, refusal accounting, and the
    topics it saw exist (to refuse auto-creation to principals without ``create``)."""

    __slots__ = ("_answers", "_generation", "_group_answers", "_guard", "_known", "_log",
                 "_logged", "principal")

    def __init__(self, guard: AccessGuard, principal: Principal,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self._guard = guard
        self.principal = principal
        self._log = log
        self._generation = guard.generation
        self._answers: dict[tuple[str | None, Operation], bool] = {}
        self._group_answers: dict[tuple[str, Operation], bool] = {}
        # Made when first needed: most connections see no refusal, many no policy.
        self._known: set[str] | None = None
        self._logged: set[tuple[str | None, str]] | None = None

    @property
    def open(self) -> bool:
        """True when no policy is configured: every check would say yes."""
        return self._guard.policy is None

    def may(self, topic: str | None, operation: Operation) -> bool:
        """Whether this connection may do ``operation`` on ``topic`` (None: no topic)."""
        policy = self._guard.policy
        if policy is None:
            return True
        if self._generation != self._guard.generation:
            self._reset()
        key = (topic, operation)
        answer = self._answers.get(key)
        if answer is None:
            answer = policy.allows(self.principal, topic, operation)
            if len(self._answers) >= CACHE_ENTRIES:
                self._answers.clear()
            self._answers[key] = answer
        return answer

    def _reset(self) -> None:
        """A new policy: forget the answers and the refusals logged."""
        self._generation = self._guard.generation
        self._answers.clear()
        self._group_answers.clear()
        self._logged = None

    def may_group(self, group: str, operation: Operation) -> bool:
        """Whether this connection may do ``operation`` (``subscribe`` or ``discover``)
        on the Kafka consumer group ``group``."""
        policy = self._guard.policy
        if policy is None:
            return True
        if self._generation != self._guard.generation:
            self._reset()
        key = (group, operation)
        answer = self._group_answers.get(key)
        if answer is None:
            answer = policy.allows_group(self.principal, group, operation)
            if len(self._group_answers) >= CACHE_ENTRIES:
                self._group_answers.clear()
            self._group_answers[key] = answer
        return answer

    def refused_group(self, group: str, operation: Operation, request: str) -> None:
        """Count and log (as :meth:`refused` does) a refusal of ``operation`` on a group:
        ``figtank_access_denied{operation="group_subscribe"}`` (or ``group_discover``)
        and an ``access_denied`` line naming the group; the client got
        GROUP_AUTHORIZATION_FAILED."""
        self._deny(f"group_{operation.value}", request, "group_authorization_failed",
                   group=group)

    def may_see(self, topic: str) -> bool:
        """Whether the topic is visible to this connection (some operation on it is
        allowed): what discovery lists and answers about."""
        return self.open or any(self.may(topic, op) for op in _TOPIC_OPERATIONS)

    def must_look_up(self, topic: str, auto_create: bool) -> bool:
        """Whether ``topic`` must be looked up before a publish or attach: the backend
        would create it when missing (``auto_create``) but this connection may not, and
        it has not seen it exist yet."""
        return auto_create and topic not in (self._known or ()) and not self.may(
            topic, Operation.CREATE)

    def seen(self, topic: str) -> None:
        """``topic`` exists (it does for good: topics are not deleted while serving)."""
        if self._known is None or len(self._known) >= CACHE_ENTRIES:
            self._known = set()
        self._known.add(topic)

    def refused(self, topic: str | None, operation: Operation | str, request: str,
                outcome: str) -> None:
        """Count a refusal of ``operation`` (or ``"discover"``: a topic hidden from a
        request that names it) and log it (rate-limited: see the module doc); ``outcome``
        says what the client got."""
        label = operation if isinstance(operation, str) else operation.value
        self._deny(label, request, outcome, topic=topic)

    def count_refusal(self, label: str) -> None:
        """Count a refusal that is not the policy's (``figtank_access_denied{operation=
        label}``); the caller logs it."""
        self._guard.count_denied(self.principal.listener, label)

    def _deny(self, label: str, request: str, outcome: str, **names: str | None) -> None:
        self._guard.count_denied(self.principal.listener, label)
        key = (next(iter(names.values())), label)
        logged = self._logged
        if logged is None:
            logged = self._logged = set()
        if key in logged or len(logged) > LOGGED_REFUSALS:
            return
        logged.add(key)
        if len(logged) > LOGGED_REFUSALS:
            self._log.warning("access_denied_logging_suppressed", identity=self.principal.name,
                              after=LOGGED_REFUSALS, action="further refusals on this "
                              "connection are counted in figtank_access_denied only, until "
                              "the policy is reloaded")
            return
        self._log.warning("access_denied", identity=self.principal.name,
                          listener=self.principal.listener, **names,
                          operation=label, request=request, outcome=outcome)


_TOPIC_OPERATIONS: Final = tuple(op for op in Operation
                                 if op not in (Operation.ADMIN, Operation.DISCOVER))
