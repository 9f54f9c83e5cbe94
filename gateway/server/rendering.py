"""One rendering of the metrics shared by the scrapes that want it, made off the event loop.

A rendering of a large registry takes tens of milliseconds of Python: made in the event
loop's thread it would stall every client for as long, once per scrape. Here it runs in a
worker thread (one at a time), scrapes that arrive while it runs wait for it and get the
same bytes (single flight), and a rendering is reused for ``reuse_secs`` after it began,
so back-to-back scrapers cost one rendering per ``reuse_secs`` whatever their number.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio

#: How long a rendering answers later scrapes (Prometheus scrapes every 15 s by default).
REUSE_SECS: Final = 1.0


class RenderFailed(Exception):
    """The rendering a scrape waited for raised (the renderer logs why)."""


class _Flight:
    """One rendering: when it began, and its bytes or its error once done."""

    def __init__(self, began: float) -> None:
        self.began = began
        self.done = trio.Event()
        self.body: bytes | None = None
        self.error: Exception | None = None


class SharedRendering:
    """``await get()``: the bytes ``render()`` returns, rendered in a worker thread at most
    once at a time and reused for ``reuse_secs``."""

    def __init__(self, render: Callable[[], bytes], reuse_secs: float = REUSE_SECS) -> None:
        self._render = render
        self.reuse_secs = reuse_secs
        self._limiter = trio.CapacityLimiter(1)
        self._flight: _Flight | None = None
        self._last: _Flight | None = None
        #: Renderings made so far.
        self.renderings = 0

    async def get(self) -> bytes:
        """A rendering that began at most ``reuse_secs`` ago, or the one under way, or a
        new one. Raises what ``render`` raised for the scrape that ran it, and
        :class:`RenderFailed` for those that waited for it."""
        while True:
            last = self._last
            if last is not None and trio.current_time() - last.began < self.reuse_secs:
                assert last.body is not None
                await trio.lowlevel.checkpoint()
                return last.body
            flight = self._flight
            if flight is None:
                return await self._fly()
            await flight.done.wait()
            if flight.body is not None:
                return flight.body
            if flight.error is not None:
                raise RenderFailed(str(flight.error)) from flight.error
            # The scrape that ran it was cancelled before the thread started: run one.

    async def _fly(self) -> bytes:
        flight = self._flight = _Flight(trio.current_time())
        try:
            # Not abandoned on cancel: a cancelled scrape waits for the thread, and its
            # bytes still serve the others (and bound the threads to one).
            flight.body = await trio.to_thread.run_sync(self._render, limiter=self._limiter)
            self.renderings += 1
            self._last = flight
            return flight.body
        except Exception as exc:
            flight.error = exc
            raise
        finally:
            self._flight = None
            flight.done.set()
