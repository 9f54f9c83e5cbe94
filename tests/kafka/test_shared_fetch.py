"""Kafka Fetch long polls woken together by one append share one read, one conversion
to record batches and one encoding of the response body per version (issue 27 item 3),
and every one of them gets the bytes the unshared path sends.

Two servers over real loopback sockets (tests/shared_reads.py): one shares reads, the
reference reads for every reader. The same connections send the same Fetches to both;
each response frame must be byte-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from gateway.client.tank import open_tank_client
from protocols.kafka import records as r
from protocols.kafka.batch import Compression, read_batches
from protocols.kafka.messages import RESPONSES, response_header_version
from protocols.kafka.records import read_response_header
from protocols.kafka.types import ApiKey
from protocols.tank.bundle import Codec
from tests.kafka.raw import request
from tests.shared_reads import (
    Reader,
    answered_after_append,
    append,
    backend_of,
    bundle,
    kafka_frame,
    open_readers,
    shared_and_reference,
)

#: One partition asked for: (topic, partition, offset, partition_max_bytes).
Part = tuple[str, int, int, int]


def fetch(version: int, correlation_id: int, parts: list[Part], *,
          max_wait_ms: int = 10_000, max_bytes: int = 1 << 24) -> bytes:
    topics: dict[str, list[Part]] = {}
    for part in parts:
        topics.setdefault(part[0], []).append(part)
    return request(ApiKey.FETCH, version, correlation_id, r.FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
        topics=[r.FetchTopic(name, [r.FetchPartition(partition=p, fetch_offset=offset,
                                                     partition_max_bytes=size)
                                    for _, p, offset, size in mine])
                for name, mine in topics.items()]))


async def _readers(servers: Any, count: int) -> list[Reader]:
    return await open_readers(servers, count, lambda info: info.kafka, kafka_frame)


async def test_woken_fetches_get_the_unshared_bytes(tmp_path: Path) -> None:
    async with shared_and_reference(tmp_path) as servers:
        await append(servers, "pub", 0, bundle(1, 3))
        await append(servers, "pub", 0, bundle(4, 2, codec=Codec.SNAPPY))
        await append(servers, "pub", 1, bundle(1, 1))
        await append(servers, "secret", 0, bundle(1, 2))
        end = 5  # pub/0 holds offsets 0..4
        # Parked at pub/0's end: versions 4, 11 and 12 (flexible), several of each, small
        # partition sizes (the first batch comes whole anyway), with another partition,
        # with a denied topic.
        parked: list[tuple[int, list[Part]]] = [
            (11, [("pub", 0, end, 1 << 20)]),
            (11, [("pub", 0, end, 1 << 20)]),
            (11, [("pub", 0, end, 1 << 20)]),
            (12, [("pub", 0, end, 1 << 20)]),
            (12, [("pub", 0, end, 1 << 20)]),
            (4, [("pub", 0, end, 1 << 20)]),
            (11, [("pub", 0, end, 10)]),
            (11, [("pub", 0, end, 10)]),
            (11, [("pub", 0, end, 1 << 20), ("pub", 1, 1, 1 << 20)]),
            (11, [("secret", 0, 2, 1 << 20), ("pub", 0, end, 1 << 20)]),
        ]
        # Answered at once: behind the end (twice over), ahead of it, a denied topic alone,
        # an offset the client must not send.
        at_once: list[tuple[int, list[Part]]] = [
            (11, [("pub", 0, 1, 1 << 20)]),
            (11, [("pub", 0, 1, 1 << 20)]),
            (12, [("pub", 0, 3, 100)]),
            (11, [("pub", 0, end + 2, 1 << 20)]),
            (11, [("secret", 0, 0, 1 << 20)]),
            (11, [("pub", 0, -1, 1 << 20)]),
        ]
        readers = await _readers(servers, len(parked) + len(at_once))
        answers = await answered_after_append(
            servers, readers, [fetch(version, correlation_id, parts) for correlation_id,
                               (version, parts) in enumerate(parked + at_once, 3)],
            len(parked), bundle(6, 4))
        # The first three asked the same: their frames differ only by the correlation id.
        assert answers[0][8:] == answers[1][8:] == answers[2][8:]
        assert answers[0][4:8] != answers[1][4:8]
        # Shared: (6, 1 MiB) by eight readers, (6, 1024) by two, (2, 1 MiB) by two.
        assert backend_of(servers[0]).shared_reads.hits >= 9  # type: ignore[union-attr]
        # Again from where they got to, with a bundle bigger than some partition sizes
        # and a response size that leaves the second partition out.
        second: list[tuple[int, list[Part]]] = [
            (11, [("pub", 0, end + 4, 1 << 20)]),
            (12, [("pub", 0, end + 4, 1 << 20)]),
            (11, [("pub", 0, end + 4, 2000)]),
            (11, [("pub", 0, end + 4, 2000)]),
        ]
        for correlation_id, (reader, (version, parts)) in enumerate(
                zip(readers[:len(second)], second, strict=True), 100):
            await reader.send(fetch(version, correlation_id, parts))
        limited = readers[len(second)]
        await limited.send(fetch(11, 200, [("pub", 0, end + 4, 1 << 20),
                                           ("pub", 1, 1, 1 << 20)], max_bytes=1))
        await trio.sleep(0.3)
        await append(servers, "pub", 0, bundle(10, 2, size=70_000))  # over 64 KiB
        for reader in [*readers[:len(second)], limited]:
            shared, reference = await reader.frames()
            assert shared == reference
        for reader in readers:
            await reader.aclose()


async def test_woken_fetches_of_each_version_get_their_codec(tmp_path: Path) -> None:
    """One Snappy bundle wakes Fetches of versions 4, 9, 10 and 12 of a topic served zstd
    and of one served gzip: the shared conversion is made per codec, so each version gets
    the unshared bytes, zstd from version 10 and gzip before it."""
    async with shared_and_reference(tmp_path, kafka_fetch_compression="zstd",
                                    kafka_fetch_compression_topics={"pub-gz": "gzip"}
                                    ) as servers:
        await append(servers, "pub", 0, bundle(1, 1))
        for info in servers:
            async with open_tank_client(*info.tank) as client:  # type: ignore[misc]
                await client.create_topic("pub-gz", 1)
        versions = [4, 9, 10, 12, 4, 12]
        requests = [fetch(v, i, [("pub", 0, 1, 1 << 20)]) for i, v in enumerate(versions)]
        requests.append(fetch(12, 50, [("pub-gz", 0, 0, 1 << 20)]))
        readers = await _readers(servers, len(requests))
        answers = await answered_after_append(servers, readers[:-1], requests[:-1],
                                              len(versions),
                                              bundle(2, 300, codec=Codec.SNAPPY))
        await readers[-1].send(requests[-1])
        await trio.sleep(0.3)
        await append(servers, "pub-gz", 0, bundle(1, 300, codec=Codec.SNAPPY))
        shared, reference = await readers[-1].frames()
        assert shared == reference
        for reader in readers:
            await reader.aclose()
    codecs = [_codecs(frame, v) for frame, v in zip(answers, [*versions], strict=True)]
    zstd, gzip = Compression.ZSTD, Compression.GZIP
    assert codecs == [[gzip], [gzip], [zstd], [zstd], [gzip], [zstd]]
    assert _codecs(shared, 12) == [gzip]


def _codecs(frame: bytes, version: int) -> list[Compression]:
    """The codecs of the batches of the one partition a Fetch response frame holds."""
    payload = frame[4:]
    _, pos = read_response_header(payload, 0, len(payload),
                              response_header_version(ApiKey.FETCH, version))
    body = RESPONSES[ApiKey.FETCH].decode(payload[pos:], version=version)
    [topic] = body.responses
    [part] = topic.partitions
    return [b.compression for b in read_batches(part.records).batches]
