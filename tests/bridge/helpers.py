"""Bridge test helpers: an embedded figtank as the upstream broker, a bridge in front of it."""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway.core.config import Settings
from gateway.server.run import ServerInfo, run_server
from tests.ports import free_port  # noqa: F401 (re-exported)

LOOPBACK = "127.0.0.1:0"




def address(info: tuple[str, int] | None) -> str:
    assert info is not None
    return f"{info[0]}:{info[1]}"


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[ServerInfo]:
    """``run_server(settings)`` in a nursery for the block, then a graceful stop."""
    async with trio.open_nursery() as nursery:
        info: ServerInfo = await nursery.start(
            lambda task_status: run_server(settings, grace=0.2, task_status=task_status))
        try:
            yield info
        finally:
            info.request_shutdown()


@asynccontextmanager
async def upstream_server(data_dir: Path, **overrides: Any) -> AsyncIterator[ServerInfo]:
    """An embedded-mode figtank: only its Tank listener, on an ephemeral loopback port."""
    options: dict[str, Any] = {"durability": "os", "tank_listen": LOOPBACK,
                               "figg_listen": "", "metrics_listen": "", "kafka_listen": "",
                               "http_listen": ""}
    options.update(overrides)
    async with running(Settings(data_dir=data_dir, **options)) as info:
        yield info


@asynccontextmanager
async def bridge_server(*upstream: str, **overrides: Any) -> AsyncIterator[ServerInfo]:
    """A bridge-mode figtank in front of ``upstream``, every listener on loopback."""
    options: dict[str, Any] = {"tank_listen": LOOPBACK, "figg_listen": LOOPBACK,
                               "metrics_listen": LOOPBACK, "kafka_listen": "", "http_listen": ""}
    options.update(overrides)
    async with running(Settings(upstream=tuple(upstream), **options)) as info:
        yield info


def metric(info: ServerInfo | tuple[str, int], name: str) -> float | None:
    """A metric's value: from the registry of an in-process server, or over HTTP."""
    if isinstance(info, ServerInfo):
        text = info.metrics_registry.render().decode()
    else:
        with urllib.request.urlopen(f"http://{info[0]}:{info[1]}/metrics", timeout=5) as r:
            text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None
