"""Bridge mode: figtank in front of an existing Tank broker.

``figtank serve --upstream HOST:PORT`` (repeatable; ``[upstream] brokers = [...]`` in the
config file) serves the Figg and Tank listeners from an upstream Tank broker instead of
the embedded store. The listeners do not know the difference: they talk to a
:class:`BridgeBackend` through the same :class:`~gateway.core.contract.Backend` protocol.

- :mod:`gateway.backend.bridge.upstream`: the one connection to the broker, reconnected with
  backoff across the addresses in order; outages logged and counted;
- :mod:`gateway.backend.bridge.produce`: appends merged into one upstream Produce per round;
- :mod:`gateway.backend.bridge.fetch`: one upstream Consume per fetch, shared by identical fetches;
- :mod:`gateway.backend.bridge.backend`: the backend itself.

::

    async with open_bridge_backend(settings, metrics) as backend:
        ...  # hand it to TankListener / FiggListener
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from gateway.backend.bridge.backend import BridgeBackend
from gateway.backend.bridge.settings import BridgeSettings
from gateway.backend.bridge.upstream import Backoff, Upstream
from gateway.client.lone import raise_lone
from gateway.core.contract import UpstreamUnavailable
from gateway.core.metrics import Metrics

__all__ = ["Backoff", "BridgeBackend", "BridgeSettings", "Upstream", "UpstreamUnavailable",
           "open_bridge_backend"]


@asynccontextmanager
async def open_bridge_backend(settings: BridgeSettings, metrics: Metrics | None = None, *,
                              upstream_options: dict[str, Any] | None = None,
                              wait_secs: float | None = None
                              ) -> AsyncIterator[BridgeBackend]:
    """Connect to ``settings.brokers`` and serve it as a backend for the block.

    Returns after the first round of connection attempts even if no broker answered (the
    gateway starts and serves once the upstream comes). ``upstream_options`` go to
    :class:`Upstream` (timeouts, backoff, keepalive); ``wait_secs``, when given, replaces
    the settings' (how long a call waits for an upstream that is away).
    """
    upstream = Upstream(settings.brokers, metrics=metrics, **(upstream_options or {}))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(upstream.run)
            backend = BridgeBackend(
                upstream, nursery, auto_create_topics=settings.auto_create_topics,
                default_partitions=settings.default_partitions,
                topic_config=settings.topic_config, max_bundle_bytes=settings.max_bundle_bytes,
                metrics=metrics,
                wait_secs=settings.wait_secs if wait_secs is None else wait_secs)
            try:
                yield backend
            finally:
                # No checkpoint in here: a Cancelled raised now would be caught by the
                # nursery's own (cancelled) scope and swallow the block's exception.
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise_lone(group)  # the background tasks never raise
