"""A figtank server with its Kafka, Tank and Figg listeners on loopback, for the Kafka tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.core.config import Settings
from gateway.server.run import ServerInfo, open_server

#: Short timeouts for the real clients: a test fails in seconds, never hangs.
CONFLUENT = {"socket.timeout.ms": 5000, "message.timeout.ms": 5000,
             "topic.metadata.refresh.interval.ms": 1000}


@asynccontextmanager
async def kafka_server(tmp_path: Path, **settings: Any) -> AsyncIterator[ServerInfo]:
    """Serve a fresh embedded store on ephemeral loopback ports (metrics off unless
    ``metrics_listen`` says where)."""
    config = Settings(data_dir=tmp_path / "data", durability=settings.pop("durability", "os"),
                      kafka_listen="127.0.0.1:0", http_listen="", tank_listen="127.0.0.1:0",
                      figg_listen="127.0.0.1:0",
                      metrics_listen=settings.pop("metrics_listen", ""), **settings)
    async with open_server(config, grace=0.2) as server:
        yield server


def bootstrap(server: ServerInfo) -> str:
    """``host:port`` of the Kafka listener."""
    assert server.kafka is not None
    return f"{server.kafka[0]}:{server.kafka[1]}"
