"""Awaiting an operation that reports through a callback.

The store and the backends start appends at once and call back when they are durable
(``append_nowait``, ``produce_nowait``): the hot paths never wait in a task. Callers that
do want to wait use :func:`completed`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def completed(start: Callable[[Callable[[T], None]], None]) -> T:
    """Call ``start(report)`` and wait until it calls ``report(result)`` (maybe before
    ``start`` returns); returns the result.

    Cancelling the wait does not cancel the operation: it goes on, reported to nobody.
    """
    done = trio.Event()
    box: list[T] = []

    def report(result: T) -> None:
        box.append(result)
        done.set()

    start(report)
    await done.wait()
    return box[0]
