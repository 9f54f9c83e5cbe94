"""A listener of the project served on an ephemeral loopback port, for in-process tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from gateway.backend.contract import Backend
from gateway.server.config import Settings
from gateway.server.metrics import Metrics


@dataclass
class RunningServer:
    """Where a test's listener is, and what it serves with."""

    host: str
    port: int
    backend: Any
    metrics: Metrics
    settings: Settings

    def metric(self, text: str) -> float | None:
        """The value of the exposition line starting with ``text`` (None: absent)."""
        for line in self.metrics.render().decode().splitlines():
            if line.startswith(text + " "):
                return float(line.rsplit(" ", 1)[1])
        return None


@asynccontextmanager
async def listening(serve: Callable[..., Any], backend: Backend, settings: Settings,
                    metrics: Metrics | None = None) -> AsyncIterator[RunningServer]:
    """Run ``serve`` (``serve_tank`` or ``serve_figg``) until the block ends."""
    metrics = metrics or Metrics()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve, backend, settings, metrics)
        port = listeners[0].socket.getsockname()[1]
        yield RunningServer("127.0.0.1", port, backend, metrics, settings)
        nursery.cancel_scope.cancel()
