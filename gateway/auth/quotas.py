"""Quotas per principal: bytes in, bytes out and requests per second, enforced by delaying.

The policy file's ``[[quota]]`` entries (:func:`parse_quotas`) become :class:`QuotaRules`:
the first entry whose ``who`` names a connection's principal gives its limits. Each
principal (by :attr:`~gateway.auth.principal.Principal.name`) has its own token buckets,
shared by all its connections (:class:`Quotas`, the server's registry); the buckets of a
principal are dropped when its last connection closes.

A quota never refuses or drops anything: a connection takes the tokens of what it read or
was sent *after* the fact (a bucket may go into debt, so a frame bigger than the burst is
still served), and waits before its next read (bytes in, requests) or before more data is
made for it (bytes out) until the debt is paid. A throttled client's TCP window fills, as
with Kafka's throttling.

- **bytes in**: every byte a client sends (its frames, whatever their type);
- **requests**: each Figg frame (every PUBLISH counts) and each Tank or Kafka request;
- **bytes out**: Tank Consume chunk bytes, Kafka Fetch record bytes, Figg DATA frames and
  on the HTTP listener fetch answers, SSE events and WebSocket data frames (not ACKs,
  PONGs or replies to admin requests).

:meth:`Quotas.replace_rules` swaps the rules (SIGHUP): every open connection gets its new
limits at once, also one waiting for tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog
import trio
from prometheus_client import Counter

from gateway.auth.policy import normalise_identity
from gateway.auth.principal import Principal
from gateway.io.limits import RECEIVE_SIZE

log = structlog.get_logger("figtank.quota")

#: The rate keys of a ``[[quota]]`` entry and the bucket each limits.
RATE_KEYS: Final = {"bytes_in_per_sec": "bytes_in", "bytes_out_per_sec": "bytes_out",
                    "requests_per_sec": "requests"}
#: The optional burst keys (default: one second's worth of the rate).
BURST_KEYS: Final = {"burst_bytes_in": "bytes_in", "burst_bytes_out": "bytes_out",
                     "burst_requests": "requests"}
_KEYS: Final = ("who", *RATE_KEYS, *BURST_KEYS)
#: The directions of ``figtank_quota_delay_seconds``.
IN: Final = "in"
OUT: Final = "out"
#: Least seconds between two ``quota_throttled`` lines of one principal.
LOG_INTERVAL_SECS: Final = 60.0
#: Fewest bytes a throttled connection asks of its socket per read.
MIN_RECEIVE_SIZE: Final = 4096


@dataclass(frozen=True, slots=True)
class Rate:
    """A token rate: ``per_sec`` tokens a second, at most ``burst`` saved up."""

    per_sec: float
    burst: float


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """What one principal may use; None: unlimited."""

    bytes_in: Rate | None = None
    bytes_out: Rate | None = None
    requests: Rate | None = None


@dataclass(frozen=True, slots=True)
class QuotaRule:
    """One ``[[quota]]`` entry: whom it covers and their limits."""

    who: tuple[str, ...]
    limits: QuotaLimits

    def covers(self, principal: Principal) -> bool:
        """Whether ``who`` names ``principal``: its certificate identity (compared as the
        access policy compares them: :func:`normalise_identity`), the listener it came
        through (``listener:NAME``), its SASL user (``user:NAME``), or ``*``."""
        who = self.who
        identity = principal.identity
        return ("*" in who or f"listener:{principal.listener}" in who
                or (principal.user is not None and f"user:{principal.user}" in who)
                or (identity is not None and normalise_identity(identity) in who))


class QuotaRules:
    """The quota entries of a policy, in order; the first that covers a principal wins."""

    def __init__(self, rules: Iterable[QuotaRule] = ()) -> None:
        self.rules: tuple[QuotaRule, ...] = tuple(rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"QuotaRules({list(self.rules)!r})"

    def for_principal(self, principal: Principal) -> QuotaLimits | None:
        """The limits of ``principal``: those of the first entry that covers it, None when
        none does (unlimited)."""
        for rule in self.rules:
            if rule.covers(principal):
                return rule.limits
        return None


def parse_quotas(entries: list[dict[str, Any]]) -> QuotaRules:
    """The rules of a policy file's ``[[quota]]`` entries (as ``tomllib`` reads them).

    Raises ``ValueError`` with one line naming the entry's index and key, e.g.
    ``quota[1].bytes_in_per_sec: must be a positive number, got -5``.
    """
    if not isinstance(entries, list):
        raise ValueError("quota: must be an array of tables ([[quota]])")
    return QuotaRules(_parse_entry(i, entry) for i, entry in enumerate(entries))


def _parse_entry(index: int, entry: object) -> QuotaRule:
    where = f"quota[{index}]"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: must be a table, got {entry!r}")
    unknown = [key for key in entry if key not in _KEYS]
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key (expected one of "
                         f"{', '.join(_KEYS)})")
    who = entry.get("who")
    if (not isinstance(who, list) or not who
            or not all(isinstance(w, str) and w for w in who)):
        raise ValueError(f"{where}.who: must be a non-empty list of identities, "
                         f"'listener:NAME', 'user:NAME' or '*', got {who!r}")
    rates: dict[str, Rate] = {}
    for key, bucket in RATE_KEYS.items():
        if key in entry:
            per_sec = _positive(f"{where}.{key}", entry[key])
            rates[bucket] = Rate(per_sec, per_sec)
    if not rates:
        raise ValueError(f"{where}: names no limit (give one of {', '.join(RATE_KEYS)})")
    for key, bucket in BURST_KEYS.items():
        if key in entry:
            if bucket not in rates:
                rate_key = next(k for k, b in RATE_KEYS.items() if b == bucket)
                raise ValueError(f"{where}.{key}: given without {rate_key}")
            rates[bucket] = Rate(rates[bucket].per_sec, _positive(f"{where}.{key}",
                                                                  entry[key]))
    return QuotaRule(tuple(w if w == "*" or w.startswith(("listener:", "user:"))
                           else normalise_identity(w) for w in who), QuotaLimits(**rates))


def _positive(where: str, value: object) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{where}: must be a positive number, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------- buckets


class TokenBucket:
    """Tokens that refill at ``rate.per_sec`` up to ``rate.burst``; :meth:`take` may
    leave them negative (debt), :meth:`delay` says how long until the debt is paid."""

    __slots__ = ("_at", "rate", "tokens")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self.tokens = rate.burst
        self._at = now

    def _refill(self, now: float) -> None:
        rate = self.rate
        self.tokens = min(rate.burst, self.tokens + (now - self._at) * rate.per_sec)
        self._at = now

    def take(self, amount: float, now: float) -> None:
        """Use ``amount`` tokens, into debt if need be."""
        self._refill(now)
        self.tokens -= amount

    def delay(self, now: float) -> float:
        """Seconds until no debt is left (0: none now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate.per_sec

    def retune(self, rate: Rate, now: float) -> None:
        """Go on at ``rate``, keeping the tokens (at most the new burst) or the debt."""
        self._refill(now)
        self.rate = rate
        self.tokens = min(self.tokens, rate.burst)


class QuotaMetrics(Protocol):
    """What the quotas count in (a server's ``Metrics``)."""

    @property
    def quota_delay(self) -> Counter:
        """Seconds of delay, by direction."""

    def limit_hit(self, limit: str, count: int = 1) -> None:
        """One more hit of ``limit`` in ``figtank_limit_hits``."""


class PrincipalQuota:
    """The buckets of one principal, shared by its connections (from
    :meth:`Quotas.acquire`). Sessions check :attr:`reads_limited` / :attr:`out_limited`
    (plain attributes: the only cost when no quota applies) before doing anything else."""

    __slots__ = ("_changed", "_delayed", "_episode", "_hits", "_last_log", "bytes_in",
                 "bytes_out", "limits", "name", "out_limited", "principal", "reads_limited",
                 "receive_size", "requests", "users")

    def __init__(self, principal: Principal, limits: QuotaLimits | None,
                 metrics: QuotaMetrics) -> None:
        #: The principal whose limits apply (its first connection's, when a certificate
        #: identity connects through several listeners).
        self.principal = principal
        self.name = principal.name
        self.users = 0
        self.limits: QuotaLimits | None = None
        self.bytes_in: TokenBucket | None = None
        self.bytes_out: TokenBucket | None = None
        self.requests: TokenBucket | None = None
        #: Whether reads wait for tokens (a bytes-in or requests limit applies).
        self.reads_limited = False
        #: Whether data sent waits for tokens (a bytes-out limit applies).
        self.out_limited = False
        #: Bytes asked of the socket per read: at most the bytes-in burst, so that one
        #: read's debt is paid within about burst / rate seconds (a second by default)
        #: and the client's pings still get through.
        self.receive_size = RECEIVE_SIZE
        self._changed = trio.Event()
        self._delayed = {IN: metrics.quota_delay.labels(IN),
                         OUT: metrics.quota_delay.labels(OUT)}
        self._hits = metrics.limit_hit
        #: Whether a throttling episode is under way, per direction.
        self._episode = {IN: False, OUT: False}
        self._last_log = -math.inf
        self.set_limits(limits)

    def set_limits(self, limits: QuotaLimits | None) -> None:
        """Apply new limits (a reload); buckets kept keep their tokens or debt, and every
        connection waiting for tokens looks again."""
        self.limits = limits
        now = trio.current_time()
        limits = limits or QuotaLimits()
        self.bytes_in = _retuned(self.bytes_in, limits.bytes_in, now)
        self.bytes_out = _retuned(self.bytes_out, limits.bytes_out, now)
        self.requests = _retuned(self.requests, limits.requests, now)
        self.reads_limited = self.bytes_in is not None or self.requests is not None
        self.receive_size = RECEIVE_SIZE if limits.bytes_in is None else int(
            min(RECEIVE_SIZE, max(MIN_RECEIVE_SIZE, limits.bytes_in.burst)))
        self.out_limited = self.bytes_out is not None
        self._changed.set()
        self._changed = trio.Event()

    # ----------------------------------------------------------------------- accounting

    def took_in(self, size: int, requests: int) -> None:
        """A read of ``size`` bytes holding ``requests`` requests was handled."""
        now = trio.current_time()
        if self.bytes_in is not None:
            self.bytes_in.take(size, now)
        if self.requests is not None and requests:
            self.requests.take(requests, now)

    def took_out(self, size: int) -> None:
        """``size`` bytes of data were queued for a client."""
        if self.bytes_out is not None:
            self.bytes_out.take(size, trio.current_time())

    def pending_ms(self, direction: str) -> int:
        """Milliseconds until the debt of ``direction`` (:data:`IN`: bytes in and
        requests, :data:`OUT`: bytes out) is paid: how long the principal's next read or
        data waits (what Kafka's ``throttle_time_ms`` tells a client)."""
        return math.ceil(self._delay(direction, trio.current_time()) * 1000)

    def out_in_debt(self) -> bool:
        """Whether data for this principal must wait now."""
        bucket = self.bytes_out
        return bucket is not None and bucket.delay(trio.current_time()) > 0

    def _delay(self, direction: str, now: float) -> float:
        if direction == OUT:
            return self.bytes_out.delay(now) if self.bytes_out is not None else 0.0
        delay = 0.0
        if self.bytes_in is not None:
            delay = self.bytes_in.delay(now)
        if self.requests is not None:
            delay = max(delay, self.requests.delay(now))
        return delay

    # -------------------------------------------------------------------------- waiting

    async def wait_in(self) -> None:
        """Wait until the reads' debt (bytes in, requests) is paid."""
        await self._wait(IN)

    async def wait_out(self) -> None:
        """Wait until the bytes-out debt is paid."""
        await self._wait(OUT)

    async def _wait(self, direction: str) -> None:
        start = trio.current_time()
        delay = self._delay(direction, start)
        if delay <= 0:
            self._episode[direction] = False
            return
        if not self._episode[direction]:
            self._begin_episode(direction, delay, start)
        while delay > 0:
            with trio.move_on_after(delay):
                await self._changed.wait()  # new limits: look again at once
            delay = self._delay(direction, trio.current_time())
        self._delayed[direction].inc(trio.current_time() - start)

    def _begin_episode(self, direction: str, delay: float, now: float) -> None:
        """Count a throttling episode; log it, at most once a LOG_INTERVAL_SECS."""
        self._episode[direction] = True
        self._hits("quota")
        if now - self._last_log >= LOG_INTERVAL_SECS:
            self._last_log = now
            limits = self.limits or QuotaLimits()
            rate = limits.bytes_out if direction == OUT else (limits.bytes_in
                                                              or limits.requests)
            log.info("quota_throttled", principal=self.name, direction=direction,
                     delay_secs=round(delay, 3),
                     per_sec=rate.per_sec if rate is not None else None,
                     action="reads from the client wait" if direction == IN else
                     "data for the client waits")


def _retuned(bucket: TokenBucket | None, rate: Rate | None, now: float
             ) -> TokenBucket | None:
    if rate is None:
        return None
    if bucket is None:
        return TokenBucket(rate, now)
    bucket.retune(rate, now)
    return bucket


class Quotas:
    """The server's quota registry: the rules in force and the buckets of the principals
    connected now. The listeners hold this one object; :meth:`replace_rules` swaps the
    rules (SIGHUP)."""

    def __init__(self, metrics: QuotaMetrics, rules: QuotaRules | None = None) -> None:
        self._metrics = metrics
        self.rules = rules or QuotaRules()
        self._principals: dict[str, PrincipalQuota] = {}

    def __len__(self) -> int:
        """Principals with a connection open now."""
        return len(self._principals)

    def get(self, name: str) -> PrincipalQuota | None:
        """The buckets of the principal named ``name``, while it has a connection open."""
        return self._principals.get(name)

    def acquire(self, principal: Principal) -> PrincipalQuota:
        """The buckets of ``principal`` for one more connection; :meth:`release` them when
        it closes."""
        state = self._principals.get(principal.name)
        if state is None:
            state = self._principals[principal.name] = PrincipalQuota(
                principal, self.rules.for_principal(principal), self._metrics)
        state.users += 1
        return state

    def release(self, state: PrincipalQuota) -> None:
        """A connection of ``state``'s principal closed; the last one drops the buckets."""
        state.users -= 1
        if state.users <= 0 and self._principals.get(state.name) is state:
            del self._principals[state.name]

    def replace_rules(self, rules: QuotaRules) -> None:
        """Put ``rules`` in force, for the connections open now too."""
        self.rules = rules
        for state in list(self._principals.values()):
            state.set_limits(rules.for_principal(state.principal))
