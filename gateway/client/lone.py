"""Run a client's connection task for a ``with`` block, and give the block's own exception
back from the nursery that wrapped it in a group."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import NoReturn

import trio

__all__ = [
    "raise_lone", "running",
]


def raise_lone(group: BaseExceptionGroup) -> NoReturn:
    """Raise the group's only exception as itself, or the group when it holds several.

    A client's background tasks never raise, so a lone exception in the group of the
    nursery around a ``with`` block is the block's own: callers see it unwrapped.
    """
    if len(group.exceptions) == 1:
        raise group.exceptions[0] from None
    raise group


@asynccontextmanager
async def running(serve: Callable[..., Awaitable[object]],
                  aclose: Callable[[], Awaitable[object]]) -> AsyncIterator[None]:
    """Run ``serve`` (a ``nursery.start`` task that never raises) for the block, then
    ``aclose()`` and stop it; the block's own exception comes out unwrapped."""
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve)
            try:
                yield
            finally:
                await aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise_lone(group)
