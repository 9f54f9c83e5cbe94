"""Fixtures: a Tank listener over a real store in ``tmp_path``, and a client connected to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.client.tank import TankClient, open_tank_client
from tests.tank.helpers import RunningServer, tank_server


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with tank_server(tmp_path / "data") as running:
        yield running


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[TankClient]:
    async with open_tank_client(server.host, server.port, request_timeout=10) as connected:
        yield connected
