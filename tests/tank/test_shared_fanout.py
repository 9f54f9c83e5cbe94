"""Tank Consumes woken together by one append share one read and one head encoding
(issue 27 item 3), and every one of them gets the bytes the unshared path sends.

Two servers over real loopback sockets (tests/shared_reads.py): one shares reads, the
reference reads for every reader. The same connections send the same Consumes to both;
each response frame must be byte-identical.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import trio

from protocols.tank.bundle import Codec
from protocols.tank.connection import FRAME_HEADER
from protocols.wire import UINT64_MAX
from tests.shared_reads import (
    Reader,
    answered_after_append,
    append,
    backend_of,
    bundle,
    open_readers,
    shared_and_reference,
    tank_frame,
)

#: One partition asked for: (topic, partition, seq, fetch_size).
Part = tuple[str, int, int, int]


def consume(request_id: int, parts: list[Part], *, max_wait_ms: int = 10_000,
            min_bytes: int = 0) -> bytes:
    """A Consume frame (client version 2), topics in the order first named."""
    topics: dict[str, list[Part]] = {}
    for part in parts:
        topics.setdefault(part[0], []).append(part)
    body = bytearray(struct.pack("<HI", 2, request_id) + b"\x04test"
                     + struct.pack("<QIB", max_wait_ms, min_bytes, len(topics)))
    for name, mine in topics.items():
        body += bytes([len(name)]) + name.encode() + bytes([len(mine)])
        for _, partition, seq, size in mine:
            body += struct.pack("<HQI", partition, seq, size)
    return FRAME_HEADER.pack(0x02, len(body)) + bytes(body)


async def _readers(servers: Any, count: int) -> list[Reader]:
    return await open_readers(servers, count, lambda info: info.tank, tank_frame)


async def test_woken_consumes_get_the_unshared_bytes(tmp_path: Path) -> None:
    async with shared_and_reference(tmp_path) as servers:
        await append(servers, "pub", 0, bundle(1, 3))
        await append(servers, "pub", 0, bundle(4, 2, codec=Codec.SNAPPY))
        await append(servers, "pub", 1, bundle(1, 1))
        await append(servers, "secret", 0, bundle(1, 2))
        tail = 6  # pub/0 holds 1..5
        # Parked at pub/0's tail: the same position with different sizes, the tail as
        # UINT64_MAX, with another partition, with a hidden topic before and after it.
        parked: list[list[Part]] = [
            [("pub", 0, tail, 1 << 20)],
            [("pub", 0, tail, 1 << 20)],
            [("pub", 0, tail, 1 << 20)],
            [("pub", 0, tail, 10)],
            [("pub", 0, tail, 100)],
            [("pub", 0, UINT64_MAX, 1 << 20)],
            [("pub", 0, tail, 1 << 20), ("pub", 1, 2, 1 << 20)],
            [("secret", 0, 3, 1 << 20), ("pub", 0, tail, 4096)],
            [("pub", 0, tail, 4096), ("secret", 0, 3, 4096)],
        ]
        # Answered at once: behind the tail (alone and twice over), ahead of it, a hidden
        # topic alone, before the first available sequence (0 is "the first").
        at_once: list[list[Part]] = [
            [("pub", 0, 2, 1 << 20)],
            [("pub", 0, 2, 1 << 20)],
            [("pub", 0, 4, 50)],
            [("pub", 0, tail + 2, 1 << 20)],
            [("secret", 0, 1, 1 << 20)],
            [("pub", 0, 0, 1 << 20), ("pub", 1, 1, 1 << 20)],
        ]
        readers = await _readers(servers, len(parked) + len(at_once))
        answers = await answered_after_append(
            servers, readers, [consume(request_id, parts)
                               for request_id, parts in enumerate(parked + at_once, 7)],
            len(parked), bundle(6, 4))
        # The first three asked the same: their frames differ only by the request id.
        assert answers[0][13:] == answers[1][13:] == answers[2][13:]
        assert answers[0][9:13] != answers[1][9:13]
        # Shared: (6, 1 MiB) by five readers (UINT64_MAX resolved to 6), (6, 4096) by two,
        # (2, 1 MiB) by two.
        assert backend_of(servers[0]).shared_reads.hits >= 6  # type: ignore[union-attr]
        # A second round on the same connections, from where each one got to.
        second: list[list[Part]] = [[("pub", 0, tail + 4, size)]
                                    for size in (1 << 20, 1 << 20, 10, 1 << 20)]
        second.append([("pub", 0, tail + 3, 1 << 20)])  # behind: at once, shared
        for request_id, (reader, parts) in enumerate(
                zip(readers[:len(second)], second, strict=True), 100):
            await reader.send(consume(request_id, parts))
        shared, reference = await readers[len(second) - 1].frames()
        assert shared == reference
        await trio.sleep(0.3)
        await append(servers, "pub", 0, bundle(10, 2, size=70_000))  # over 64 KiB
        for reader in readers[:len(second) - 1]:
            shared, reference = await reader.frames()
            assert shared == reference
        for reader in readers:
            await reader.aclose()


async def test_a_timed_out_poll_is_not_shared(tmp_path: Path) -> None:
    async with shared_and_reference(tmp_path) as servers:
        await append(servers, "pub", 0, bundle(1, 2))
        readers = await _readers(servers, 3)
        for request_id, reader in enumerate(readers, 1):
            await reader.send(consume(request_id, [("pub", 0, 3, 1 << 20)],
                                      max_wait_ms=100))
        for reader in readers:
            shared, reference = await reader.frames()
            assert shared == reference
        assert backend_of(servers[0]).shared_reads.hits == 0  # type: ignore[union-attr]
        for reader in readers:
            await reader.aclose()
