"""How long to wait before reconnecting: one exponential backoff with jitter for every
reconnecting client (the Figg client, the bridge's upstream connection)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Backoff(Protocol):
    """Seconds to wait before connection attempt ``attempt`` (0 = the first redial)."""

    def __call__(self, attempt: int) -> float: ...


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """0 for attempt 0 (the first redial is immediate), then ``base * 2**(attempt-1)``
    capped at ``cap``, times a jitter drawn from ``[jitter[0], jitter[1])`` with ``rng``.

    The defaults are the Figg client's: 0, then 1, 2, 4, 8, 16 s capped at 30 s, each
    times a jitter in [0.8, 1.2).
    """

    base: float = 1.0
    cap: float = 30.0
    jitter: tuple[float, float] = (0.8, 1.2)
    rng: Callable[[], float] = random.random

    def __call__(self, attempt: int) -> float:
        if attempt <= 0:
            return 0.0
        delay = min(self.base * 2.0 ** min(attempt - 1, 62), self.cap)
        low, high = self.jitter
        return delay * (low + (high - low) * self.rng())
