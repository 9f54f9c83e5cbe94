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

from protocols.kafka import records as r
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
