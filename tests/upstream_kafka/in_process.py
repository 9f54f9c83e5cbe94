"""An upstream-Kafka backend in the test's own trio run, over a stand-in upstream of its
own (a ``figtank serve`` process): for tests of what the backend does between a front end's
request and the upstream's answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from gateway.backend.kafka import open_kafka_backend
from gateway.backend.kafka.backend import KafkaBackend
from gateway.backend.kafka.settings import UpstreamKafkaSettings
from gateway.core.config import Settings
from gateway.core.contract import FetchOutcome, FetchRequest, FetchStatus, ProduceBatch, ProduceCode
from protocols.tank.bundle import Message, decode_chunk, encode_bundle
from tests.upstream_kafka.helpers import Upstream


@asynccontextmanager
async def backend_with_topic(tmp_path: Path, topic: str, partitions: int = 1,
                             **settings: object) -> AsyncIterator[KafkaBackend]:
    """A backend over a stand-in upstream of its own, ``topic`` made; ``settings``: the
    gateway's (``Settings`` fields)."""
    upstream = Upstream(tmp_path / "up")
    gateway = Settings(data_dir=tmp_path / "gw", upstream_kafka=(upstream.address,),
                       **settings)  # type: ignore[arg-type]
    try:
        with trio.fail_after(60):
            await upstream.start()
            async with open_kafka_backend(UpstreamKafkaSettings.of(gateway)) as backend:
                assert await backend.create_topic(topic, partitions) == 0
                yield backend
    finally:
        upstream.close()


async def produce(backend: KafkaBackend, topic: str, messages: list[Message],
                  partition: int = 0) -> int:
    """``messages`` to ``topic``/``partition`` in one bundle; the last sequence number it
    got."""
    [done] = await backend.produce([ProduceBatch(topic, partition, encode_bundle(messages))])
    assert done.code is ProduceCode.OK and done.last_seq is not None
    return done.last_seq


def data_of(got: FetchOutcome) -> bytes:
    """The bytes of a read that found data (its chunk released)."""
    assert got.status is FetchStatus.DATA and got.chunk.length
    try:
        return got.chunk.read_bytes()
    finally:
        got.chunk.close()


async def read_once(backend: KafkaBackend, topic: str, seq: int, size: int = 64 << 20, *,
                    partition: int = 0) -> tuple[FetchOutcome, bytes]:
    """One read that finds data, as a Tank consumer asks it (``size`` bytes from ``seq``,
    64 MiB as tank-cli asks): its outcome, and its bytes (the chunk released)."""
    [got] = await backend.fetch([FetchRequest(topic, partition, seq, size)],
                                max_wait_ms=2000, min_bytes=1)
    return got, data_of(got)


async def read_to(backend: KafkaBackend, topic: str, end: int, *, partition: int = 0,
                  size: int = 64 << 20, seq: int = 1) -> list[bytes]:
    """The values of ``topic``/``partition`` from ``seq`` to ``end``, read as a Tank
    consumer reads (``size`` bytes asked a read, from where the last one ended)."""
    values: list[bytes] = []
    while seq <= end:
        got, data = await read_once(backend, topic, seq, size, partition=partition)
        assert got.next_seq is not None and got.next_seq > seq
        values += [m.value for m in decode_chunk(data, got.base_seq, seq).messages]
        seq = got.next_seq
    return values
