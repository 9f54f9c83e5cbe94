"""A figtank server in a background thread of the test process, and producing helpers."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from gateway.backend.embedded import EmbeddedSettings, open_embedded_backend
from gateway.client.tank_blocking import BlockingTankClient
from gateway.core.config import Settings
from gateway.server.run import ServerInfo, run_server
from gateway.store import NO_BOUNDS
from protocols.tank.bundle import Message


class BackgroundServer:
    """``run_server`` on its own trio loop in a daemon thread (Spark tests are sync).

    CreateTopic's config is not bound by the minimums (the segment tests use 4 KiB
    segments)."""

    def __init__(self, data_dir: Path, **settings: object) -> None:
        self.data_dir = data_dir
        self.settings = Settings().with_overrides(
            data_dir=str(data_dir), tank_listen="127.0.0.1:0", figg_listen="",
            metrics_listen="", kafka_listen="", http_listen="", **settings)
        self._ready = threading.Event()
        self._info: ServerInfo | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="figtank-server", daemon=True)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported by start()
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        async with open_embedded_backend(EmbeddedSettings.of(self.settings),
                                         config_bounds=NO_BOUNDS) as backend, \
                trio.open_nursery() as nursery:
            self._info = await nursery.start(partial(run_server, self.settings,
                                                     backend=backend, grace=0.5))
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()

    def start(self) -> BackgroundServer:
        self._thread.start()
        self._ready.wait(30)
        if self._info is None:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        return self

    @property
    def endpoint(self) -> str:
        assert self._info is not None and self._info.tank is not None
        host, port = self._info.tank
        return f"{host}:{port}"

    def client(self) -> BlockingTankClient:
        host, _, port = self.endpoint.rpartition(":")
        return BlockingTankClient(host, int(port), request_timeout=30)

    def stop(self) -> None:
        if self._token is not None and self._info is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._info.request_shutdown, trio_token=self._token)
        self._thread.join(30)


@dataclass(frozen=True)
class Produced:
    """A message as the tests produced it (sequence numbers as the broker assigned)."""

    partition: int
    sequence: int
    timestamp: int
    key: bytes | None
    value: bytes


def produce(server: BackgroundServer, topic: str, per_partition: dict[int, int], *,
            tag: str = "m", bundle: int = 50, start_ts: int = 1_700_000_000_000
            ) -> list[Produced]:
    """Produce ``n`` messages to each partition (keys on every other one, distinct
    timestamps), in bundles of ``bundle``; returns them with their sequence numbers."""
    out: list[Produced] = []
    with server.client() as client:
        bounds = {b.partition: b.high_water_mark for b in _bounds(client, topic)}
        for partition, n in per_partition.items():
            seq = bounds.get(partition, 0) + 1
            for lo in range(0, n, bundle):
                messages = []
                for i in range(lo, min(n, lo + bundle)):
                    key = f"k{i % 7}".encode() if i % 2 else None
                    ts = start_ts + 1000 * i + partition
                    value = f"{tag}-{partition}-{i}".encode()
                    messages.append(Message(value, key, ts))
                    out.append(Produced(partition, seq, ts, key, value))
                    seq += 1
                client.produce({(topic, partition): messages})
    return out


def _bounds(client: BlockingTankClient, topic: str) -> list:
    from gateway.client.errors import UnknownTopicError

    try:
        return client.discover_partitions(topic)
    except UnknownTopicError:
        return []


Row = tuple[int, int, int, bytes | None, bytes]


def rows_of(df: Any) -> list[Row]:
    """(partition, sequence, timestamp ms, key, value), sorted."""
    picked = df.selectExpr("partition", "sequence", "unix_millis(timestamp) AS ms", "key",
                           "value")
    return sorted((r.partition, r.sequence, r.ms, None if r.key is None else bytes(r.key),
                   bytes(r.value)) for r in picked.collect())


def expected(produced: list[Produced]) -> list[Row]:
    return sorted((p.partition, p.sequence, p.timestamp, p.key, p.value) for p in produced)


def reader(spark: Any, server: BackgroundServer, topic: str, **options: object):
    read = spark.read.format("figtank").option("endpoint", server.endpoint).option("topic", topic)
    for name, value in options.items():
        read = read.option(name, str(value))
    return read
