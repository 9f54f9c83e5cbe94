"""Whether the upstream Kafka cluster answers, as the gateway's state.

:class:`UpstreamHealth` asks: a Metadata request (no topics) to a broker every
``interval`` while the upstream answers and every ``down_interval`` while it does not (a
request of the gateway's that failed makes it ask at once: :meth:`UpstreamHealth.suspect`).
Each change of state is one log line (``upstream_up`` / ``upstream_down``), the
``figtank_upstream_up`` gauge and the ``figtank_upstream_outages`` counter, as in bridge
mode.

When the upstream refuses the gateway's credentials (SASL, TLS) the reason is logged once
(``upstream_authentication_failed``) and given by :meth:`~UpstreamHealth.unavailable`
until the upstream answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from gateway.backend.kafka.wire import AuthenticationFailed
from gateway.core.metrics import Metrics

log = structlog.get_logger("figtank.upstream_kafka")


class UpstreamHealth:
    """Tracks whether the upstream answers; see the module doc.

    ``await probe(timeout)`` raises when the upstream does not answer within ``timeout``
    seconds: ``timeout`` normally, ``suspect_timeout`` right after a request to it failed
    (a short outage, a restart, is then seen even when the upstream is back before the
    next regular probe); :class:`~gateway.backend.kafka.wire.AuthenticationFailed` when it
    refuses the gateway's credentials.
    """

    def __init__(self, probe: Callable[[float], Awaitable[Any]], addresses: tuple[str, ...],
                 *,
                 metrics: Metrics | None = None, interval: float = 5.0,
                 down_interval: float = 0.5, timeout: float = 2.0,
                 suspect_timeout: float = 0.5) -> None:
        self._probe = probe
        self.addresses = addresses
        self._metrics = metrics
        self.interval = interval
        self.down_interval = down_interval
        self.timeout = timeout
        self.suspect_timeout = suspect_timeout
        self._suspected = False
        self._up: bool | None = None  # None until the first probe
        self._ever_up = False
        self._changed = trio.Event()
        self._wake = trio.Event()
        self._down_since: float | None = None
        self.outages = 0
        self.reason = "not asked yet"
        #: Why the upstream refused the gateway's credentials, until it answers again.
        self.refusal: str | None = None
        if metrics is not None:
            metrics.include(metrics.upstream_up, metrics.upstream_outages,
                            metrics.upstream_errors, metrics.upstream_feed_written_through,
                            metrics.upstream_feed_pushes)
            metrics.upstream_up.set(0)

    @property
    def up(self) -> bool:
        """Whether the upstream answered the last probe."""
        return bool(self._up)

    @property
    def ever_up(self) -> bool:
        """Whether the upstream ever answered since the gateway started."""
        return self._ever_up

    def down_for(self) -> float:
        """Seconds the upstream has been away (0 while it answers)."""
        if self._up or self._down_since is None:
            return 0.0
        return trio.current_time() - self._down_since

    def unavailable(self) -> str | None:
        """Why the gateway can not serve now, or None while the upstream answers."""
        if self._up:
            return None
        reason = f"{self.refusal}; {self.reason}" if self.refusal else self.reason
        return f"upstream unreachable: {', '.join(self.addresses)}: {reason}"

    def suspect(self) -> None:
        """A request to the upstream failed: probe now, with the short timeout."""
        self._suspected = True
        self._wake.set()

    def refused(self, reason: str) -> None:
        """The upstream refused the gateway's credentials (SASL, TLS): logged once until
        the upstream answers."""
        if self.refusal is None:
            log.error("upstream_authentication_failed", addresses=list(self.addresses),
                      reason=_short_text(reason))
        self.refusal = _short_text(reason)

    async def wait_up(self, deadline: float) -> bool:
        """Wait until the upstream answers or ``deadline`` (trio time) passes."""
        while not self._up:
            if trio.current_time() >= deadline:
                return False
            with trio.move_on_at(deadline):
                await self._changed.wait()
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Probe until cancelled; ``started()`` after the first probe, answered or not."""
        self._down_since = trio.current_time()
        started = False
        while True:
            timeout = self.suspect_timeout if self._suspected else self.timeout
            self._suspected = False
            try:
                with trio.fail_after(timeout):
                    await self._probe(timeout)
            except AuthenticationFailed as exc:
                self.refused(str(exc))
                self._went_down(_short(exc))
            except trio.TooSlowError:
                self._went_down(f"no answer in {timeout:g} s")
            except Exception as exc:
                self._went_down(_short(exc))
            else:
                self._went_up()
            if not started:
                task_status.started()
                started = True
            self._wake = trio.Event()
            with trio.move_on_after(self.interval if self._up else self.down_interval):
                await self._wake.wait()

    def _went_up(self) -> None:
        if self._up:
            return
        down = self.down_for()
        self._up = True
        self._ever_up = True
        self.reason = ""
        self.refusal = None
        if self._metrics is not None:
            self._metrics.upstream_up.set(1)
        log.info("upstream_up", addresses=list(self.addresses), down_secs=round(down, 3))
        self._changed.set()
        self._changed = trio.Event()

    def _went_down(self, reason: str) -> None:
        self.reason = reason
        if self._up is False:
            return
        self._up = False
        self._down_since = trio.current_time()
        self.outages += 1
        if self._metrics is not None:
            self._metrics.upstream_up.set(0)
            self._metrics.upstream_outages.inc()
        log.warning("upstream_down", addresses=list(self.addresses), reason=reason,
                    outages=self.outages)
        self._changed.set()
        self._changed = trio.Event()


def _short(exc: BaseException) -> str:
    return _short_text(str(exc) or type(exc).__name__)


def _short_text(text: str) -> str:
    return text if len(text) <= 300 else text[:297] + "..."
