"""Latency samples and their percentiles."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

#: Percentiles every latency summary holds, by name.
PERCENTILES: Final = (("p50", 0.50), ("p99", 0.99), ("p999", 0.999))


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..1) of values sorted ascending."""
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summarize(samples: Iterable[float]) -> dict[str, float] | None:
    """``{count, mean, p50, p99, p999, max}`` in seconds, or None without samples."""
    ordered = sorted(samples)
    if not ordered:
        return None
    summary: dict[str, float] = {"count": len(ordered),
                                 "mean": math.fsum(ordered) / len(ordered)}
    for name, q in PERCENTILES:
        summary[name] = percentile(ordered, q)
    summary["max"] = ordered[-1]
    return summary


def stride(total: int, cap: int) -> int:
    """Keep every ``stride``-th of ``total`` events to hold at most about ``cap`` samples."""
    return max(1, math.ceil(total / cap)) if cap > 0 else max(1, total)


def best_rate(fn: Callable[[], object], min_seconds: float, repeat: int) -> float:
    """Calls per second of ``fn``: best of ``repeat`` runs of at least ``min_seconds``
    (the micro-benchmarks in ``gateway.bench.micro``)."""
    best = 0.0
    for _ in range(repeat):
        calls = 0
        start = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = max(best, calls / elapsed)
    return best
