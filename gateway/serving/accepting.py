"""The accept loops of every listener (Figg, Tank, the HTTP endpoint), in place of
``trio.serve_listeners``.

An accept that fails for want of a resource (no descriptor left: EMFILE, ENFILE; no
kernel memory: ENOBUFS, ENOMEM) leaves the connection waiting in the listen backlog. The
loop logs one structured ``accept_failed`` warning when such a run of failures starts,
counts it once as ``figtank_limit_hits{limit="open_files"}``, and retries with a backoff
(10 ms doubling up to 0.5 s) while the connections already open are served on; the first
accept that succeeds again logs ``accept_recovered`` with how long it failed and how many
retries it took. trio's own loop logs a traceback every 0.1 s instead.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import structlog
import trio

from gateway.core.metrics import Metrics
from gateway.io.backoff import ExponentialBackoff

log = structlog.get_logger("figtank.accept")

#: The accept failures that mean "out of a resource for now", not a broken listener.
CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Seconds before retry ``n`` (1, 2, ...) of a failing accept: 10 ms doubling to 0.5 s.
ACCEPT_BACKOFF: Final = ExponentialBackoff(base=0.01, cap=0.5, jitter=(1.0, 1.0))

Handler = Callable[[trio.SocketStream], Awaitable[object]]


async def serve_listeners(handler: Handler, listeners: Sequence[trio.SocketListener], *,
                          name: str, metrics: Metrics,
                          handler_nursery: trio.Nursery | None = None,
                          task_status: trio.TaskStatus[Sequence[trio.SocketListener]]
                          = trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections on every listener until cancelled; run ``handler(stream)`` for
    each in ``handler_nursery`` (default: a nursery of this call) and close the stream
    after it. ``name`` (``figg``, ``tank``, ``metrics``) goes into the log lines. A
    listener that fails otherwise than for a resource ends the call with that error."""
    async with trio.open_nursery() as nursery:
        handlers = handler_nursery or nursery
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, handler, handlers, name, metrics)
        task_status.started(listeners)


async def _accept_loop(listener: trio.SocketListener, handler: Handler,
                       handlers: trio.Nursery, name: str, metrics: Metrics) -> None:
    failing_since: float | None = None
    retries = 0
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in CAPACITY_ERRNOS:
                raise
            if failing_since is None:
                failing_since, retries = trio.current_time(), 0
                metrics.limit_hit("open_files")
                log.warning("accept_failed", listener=name,
                            errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                            error=exc.strerror,
                            action="serving open connections; retrying with backoff")
            retries += 1
            await trio.sleep(ACCEPT_BACKOFF(retries))
            continue
        if failing_since is not None:
            log.warning("accept_recovered", listener=name, retries=retries,
                        failed_secs=round(trio.current_time() - failing_since, 3))
            failing_since = None
        handlers.start_soon(_run_handler, handler, stream)


async def _run_handler(handler: Handler, stream: trio.SocketStream) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)
