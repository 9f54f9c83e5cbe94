"""Giving up on messages that will never come."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def cancel_when_stalled(scope: trio.CancelScope, progress: Callable[[], int],
                              stall: float, *, interval: float = 0.25) -> None:
    """Cancel ``scope`` once ``progress()`` has not changed for ``stall`` seconds.

    Receivers wait for every message they expect; when some were lost they would wait for
    ever, so a run ends this way and its count check reports what is missing.
    """
    last = progress()
    since = trio.current_time()
    while True:
        await trio.sleep(interval)
        value = progress()
        now = trio.current_time()
        if value != last:
            last, since = value, now
        elif now - since >= stall:
            scope.cancel()
            return
