"""One task per listener closes its idle connections, instead of a timer task per connection.

An idle connection should cost little more than its socket: a task of its own that sleeps
until its idle deadline is a coroutine, a cancel scope and a timer (about 2 KB), and a
deadline armed around every read would cost time on every request. The
:class:`IdleSweeper` of a listener instead looks at all its connections every
:func:`sweep_interval` (a quarter of the idle timeout, at most a second) and asks each to
close if it has been idle for its timeout (:meth:`Session.sweep
<gateway.serving.session.Session.sweep>`, which also lets a parked writer task end). A
connection therefore closes between its timeout and a quarter of it later. The task runs
only while the listener has connections.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Final

import trio

#: Longest pause between two sweeps, in seconds.
MAX_INTERVAL: Final = 1.0


def sweep_interval(timeout: float) -> float:
    """Seconds between sweeps for connections whose idle timeout is ``timeout``."""
    return min(timeout / 4, MAX_INTERVAL)


def idle_timeout(session: object) -> float:
    """``session``'s idle timeout; ``math.inf`` for one that never times out or does so by
    itself (an HTTP session has no ``idle_timeout``)."""
    timeout: float = getattr(session, "idle_timeout", math.inf)
    return timeout


class IdleSweeper:
    """Closes the idle ones among ``sessions`` (a live collection: the listener's own;
    those with an ``idle_timeout`` and ``sweep(now)``), from one task started with
    the first connection (:meth:`started`) and ended with the last (:meth:`ended`). The
    sessions of one listener share their settings: the first one's timeout sets the pace."""

    __slots__ = ("_scope", "_sessions")

    def __init__(self, sessions: Collection[object]) -> None:
        self._sessions = sessions
        self._scope: trio.CancelScope | None = None

    def started(self, session: object) -> None:
        """``session`` was added to the collection: make sure the sweeper runs. Called from
        the connection's task: the sweeper is started in the same nursery."""
        timeout = idle_timeout(session)
        if self._scope is not None or timeout == math.inf:
            return
        nursery = trio.lowlevel.current_task().parent_nursery
        if nursery is None:  # the root task: nothing to start it in
            return
        self._scope = trio.CancelScope()
        nursery.start_soon(self._sweep, self._scope, sweep_interval(timeout))

    def ended(self) -> None:
        """A session left the collection: when none is left, stop the sweeper."""
        if not self._sessions and self._scope is not None:
            self._scope.cancel()
            self._scope = None

    async def _sweep(self, scope: trio.CancelScope, interval: float) -> None:
        with scope:
            while self._sessions:
                await trio.sleep(interval)
                now = trio.current_time()
                for session in list(self._sessions):
                    sweep = getattr(session, "sweep", None)
                    if sweep is not None:
                        sweep(now)
        if self._scope is scope:
            self._scope = None
