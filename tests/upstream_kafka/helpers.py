"""Upstream-Kafka tests: a ``figtank serve`` process as the upstream cluster (its embedded
store behind its Kafka listener, since no Kafka broker can be installed here) and
``figtank serve --upstream-kafka`` gateways in front of it, as real processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from gateway.client.tank import open_tank_client
from tests.bridge.helpers import free_port
from tests.serving import Served

LOOPBACK = "127.0.0.1:0"


class Upstream:
    """The upstream: Kafka listener (what gateways use) and Tank listener (what the tests
    read the stored log with) on fixed ports, so that it comes back where it was after a
    kill."""

    def __init__(self, data_dir: Path, *more: str) -> None:
        self.kafka_port = free_port()
        self.tank_port = free_port()
        self.address = f"127.0.0.1:{self.kafka_port}"
        self.served = Served(
            "--data-dir", str(data_dir), "--durability", "fsync",
            "--kafka-listen", self.address, "--tank-listen", f"127.0.0.1:{self.tank_port}",
            "--figg-listen", "", "--metrics-listen", "", "--grace", "0.2", *more)

    async def stored(self, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
        """``(sequence, value)`` of every message the upstream holds in the partition."""
        async with open_tank_client("127.0.0.1", self.tank_port, request_timeout=10) as tank:
            bounds = await tank.discover_partitions(topic)
            high = bounds[partition].high_water_mark
            out: list[tuple[int, bytes]] = []
            seq = 1
            while seq <= high:
                result = await tank.consume(topic, partition, seq, fetch_size=4 * 1024 * 1024)
                out += [(m.seq, m.value) for m in result.messages if m.seq >= seq]
                seq = result.next_seq if result.messages else high + 1
            return out


def gateway(upstream: str, *more: str) -> Served:
    """A gateway in upstream-Kafka mode, every listener on an ephemeral loopback port."""
    return Served("--upstream-kafka", upstream, "--tank-listen", LOOPBACK,
                  "--figg-listen", LOOPBACK, "--kafka-listen", LOOPBACK,
                  "--metrics-listen", LOOPBACK, "--grace", "0.2", *more)


def kafka_address(served: Any) -> str:
    host, port = served.kafka
    return f"{host}:{port}"


async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """A blocking client call (confluent-kafka, kafka-python) in a worker thread."""
    return await trio.to_thread.run_sync(fn, *args)
