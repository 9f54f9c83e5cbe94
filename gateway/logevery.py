"""How often a repeated event may be logged: a client (or a limit hit again and again)
must not be able to turn the log into its own flood."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Final

#: The default: one line a minute per key.
EVERY_SECS: Final = 60.0


class LogEvery:
    """Lets one line per key through every ``interval`` seconds and counts the rest.

    ``due(key)`` returns None while the key's line is held back (counting it), else how
    many were held back since the last line (0 the first time): log then, with that
    count. Memory is one entry per key, so keys must come from a small set (event names,
    limit names), never from what clients send.
    """

    __slots__ = ("_held", "_last", "interval")

    def __init__(self, interval: float = EVERY_SECS) -> None:
        self.interval = interval
        self._last: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}

    def due(self, key: Hashable = None) -> int | None:
        """None: not yet (counted); else the lines held back since the key's last one."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)
