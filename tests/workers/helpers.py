"""``figtank serve --workers N`` as real processes: an upstream ``figtank serve`` (its
embedded store behind a Tank and a Kafka listener, on fixed ports) and a gateway of
several workers in front of it."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from gateway.client.tank import open_tank_client
from tests.ports import free_port
from tests.serving import Served, ServeProcess

LOOPBACK = "127.0.0.1:0"


class Upstream:
    """A ``figtank serve`` on its embedded store: the Tank listener (bridge mode's
    upstream, and how tests read what it holds) and the Kafka listener (upstream-Kafka
    mode's)."""

    def __init__(self, data_dir: Path) -> None:
        self.tank_port = free_port()
        self.kafka_port = free_port()
        self.tank = f"127.0.0.1:{self.tank_port}"
        self.kafka = f"127.0.0.1:{self.kafka_port}"
        self.served = Served("--data-dir", str(data_dir), "--durability", "os",
                             "--tank-listen", self.tank, "--kafka-listen", self.kafka,
                             "--figg-listen", "", "--metrics-listen", "", "--grace", "0.2")

    async def stored(self, topic: str, partition: int = 0) -> list[bytes]:
        """The values the upstream holds in the partition, in order."""
        async with open_tank_client("127.0.0.1", self.tank_port, request_timeout=10) as tank:
            high = (await tank.discover_partitions(topic))[partition].high_water_mark
            values: list[bytes] = []
            seq = 1
            while seq <= high:
                result = await tank.consume(topic, partition, seq, fetch_size=4 * 1024 * 1024)
                values += [m.value for m in result.messages if m.seq >= seq]
                seq = result.next_seq if result.messages else high + 1
            return values


def gateway(*mode: str, workers: int = 2, grace: float = 1.0, more: tuple[str, ...] = ()
            ) -> Served:
    """A gateway of ``workers`` workers (``mode``: ``--upstream ADDR`` or
    ``--upstream-kafka ADDR``), every listener on an ephemeral loopback port."""
    return Served(*mode, "--workers", str(workers), "--tank-listen", LOOPBACK,
                  "--figg-listen", LOOPBACK, "--kafka-listen", LOOPBACK,
                  "--http-listen", LOOPBACK, "--metrics-listen", LOOPBACK,
                  "--grace", str(grace), *more)


@asynccontextmanager
async def upstream_and_gateway(root: Path, kind: str = "bridge", *, workers: int = 2,
                               grace: float = 1.0, more: tuple[str, ...] = ()
                               ) -> AsyncIterator[tuple[Upstream, Served, ServeProcess]]:
    """An upstream and a gateway of ``workers`` workers in front of it (``kind``: bridge,
    over its Tank listener, or upstream-kafka, over its Kafka listener), both started
    within 60 s and closed on the way out."""
    upstream = Upstream(root / "up")
    mode = (("--upstream", upstream.tank) if kind == "bridge"
            else ("--upstream-kafka", upstream.kafka))
    front = gateway(*mode, workers=workers, grace=grace, more=more)
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            served = await front.start()
        yield upstream, front, served
    finally:
        front.close()
        upstream.served.close()


def scrape(served: ServeProcess, path: str = "/metrics") -> tuple[int, str]:
    """GET ``path`` from the gateway's metrics endpoint: status and body."""
    assert served.metrics is not None
    host, port = served.metrics
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples called ``name`` of a Prometheus text exposition: labels and value."""
    return [(s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels``."""
    return sum(v for have, v in samples(text, name)
               if all(have.get(k) == want for k, want in labels.items()))


def worker_pids(served: ServeProcess) -> list[int]:
    """The pids of the workers serving at start (the supervisor's ``figtank_serving``)."""
    return list(served.events("figtank_serving")[-1]["pids"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def wait_for(condition: object, timeout: float = 20.0, every: float = 0.1) -> None:
    """Poll ``condition()`` (in a worker thread) until it is true; fail after
    ``timeout`` seconds."""
    assert callable(condition)
    with trio.fail_after(timeout):
        while not await trio.to_thread.run_sync(condition):
            await trio.sleep(every)
