"""Consume over loopback: sequence 0 and UINT64_MAX, boundaries, long poll, pipelining,
partial bundles, and chunks sent with sendfile."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import gateway.io.writer
from gateway.backend.embedded import EmbeddedSettings, open_embedded_backend
from gateway.client.errors import BoundaryError, UnknownPartitionError, UnknownTopicError
from gateway.client.tank import TAIL, TankClient, open_tank_client
from gateway.core.config import Settings
from gateway.core.contract import BytesChunk, FetchOutcome, FetchRequest
from protocols.tank.bundle import Message
from protocols.tank.connection import Reply
from protocols.tank.messages import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    Ping,
    StatusRequest,
)
from protocols.tank.types import ConsumeFlags
from tests.tank.helpers import RawClient, RunningServer, serving, tank_server


def consume_request(request_id: int, parts: Sequence[tuple[str, int, int]], *,
                    max_wait_ms: int = 0, min_bytes: int = 0, fetch_size: int = 65536) -> Any:
    topics: dict[str, list[Any]] = {}
    for topic, partition, seq in parts:
        topics.setdefault(topic, []).append(ConsumePartition(partition, seq, fetch_size))
    return ConsumeRequest(2, request_id, "test", max_wait_ms, min_bytes, 0,
                          [ConsumeTopic(name, p) for name, p in topics.items()])


async def raw_client(server: RunningServer) -> RawClient:
    raw = await RawClient.connect(server)
    assert type(await raw.next()) is Ping
    return raw


async def test_first_available_and_tail(client: TankClient) -> None:
    await client.produce({("t", 0): [b"a", b"b", b"c"]})
    result = await client.consume("t", 0, 0)
    assert [m.seq for m in result.messages] == [1, 2, 3]
    at_tail = await client.consume("t", 0, TAIL)
    assert (at_tail.messages, at_tail.next_seq, at_tail.high_water_mark) == ([], 4, 3)
    # hwm + 1 is a wait (here: none), not an error
    assert (await client.consume("t", 0, 4)).messages == []


async def test_messages_before_the_requested_sequence_are_skipped(client: TankClient) -> None:
    await client.produce({("t", 0): [b"1", b"2", b"3", b"4", b"5"]})
    result = await client.consume("t", 0, 3)
    assert [(m.seq, m.value) for m in result.messages] == [(3, b"3"), (4, b"4"), (5, b"5")]
    assert result.next_seq == 6


async def test_boundary_error_past_the_end(client: TankClient) -> None:
    await client.produce({("t", 0): [b"a", b"b"]})
    with pytest.raises(BoundaryError) as caught:
        await client.consume("t", 0, 9)
    assert (caught.value.first_available, caught.value.high_water_mark) == (1, 2)


async def test_boundary_error_after_retention(client: TankClient) -> None:
    await client.create_topic("ret", 1, {"log.segment.bytes": "64kb",  # the minimum
                                         "retention.segments.count": "2"})
    for i in range(12):  # two messages a segment (random bytes: the client compresses)
        await client.produce({("ret", 0): [random.Random(i).randbytes(30_000)]})
    [bounds] = await client.discover_partitions("ret")
    assert bounds.first_available > 1
    with pytest.raises(BoundaryError) as caught:
        await client.consume("ret", 0, 1)
    assert caught.value.first_available == bounds.first_available
    assert caught.value.high_water_mark == 12
    # Sequence 0 means "first available": no error.
    result = await client.consume("ret", 0, 0)
    assert result.messages[0].seq == bounds.first_available
    seqs = [m.seq for m in result.messages]
    while result.next_seq <= 12:  # a chunk never crosses a segment
        result = await client.consume("ret", 0, result.next_seq)
        seqs += [m.seq for m in result.messages]
    assert seqs == list(range(bounds.first_available, 13))


async def test_unknown_topic_and_partition(client: TankClient, server: RunningServer) -> None:
    await client.produce({("known", 0): [b"x"]})
    with pytest.raises(UnknownTopicError):
        await client.consume("unknown", 0, 1)
    with pytest.raises(UnknownPartitionError):
        await client.consume("known", 3, 1)
    raw = await raw_client(server)
    await raw.send(consume_request(1, [("known", 0, 1), ("unknown", 0, 1), ("unknown", 1, 1),
                                       ("known", 3, 1)], max_wait_ms=5000))
    with trio.fail_after(5):
        reply = await raw.next()
    known, unknown = reply.response.topics
    assert (unknown.name, unknown.unknown, unknown.requested_partitions) == ("unknown", True, 2)
    assert [p.flags for p in known.partitions] == [ConsumeFlags.OK,
                                                   ConsumeFlags.UNKNOWN_PARTITION]
    assert known.partitions[0].chunk
    await raw.aclose()


async def test_long_poll_wakes_on_append(client: TankClient, server: RunningServer) -> None:
    await client.produce({("lp", 0): [b"old"]})
    got: list[Any] = []

    async def consumer() -> None:
        got.append(await client.consume("lp", 0, TAIL, max_wait_ms=20_000))

    async with open_tank_client(server.host, server.port) as producer:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consumer)
                await trio.sleep(0.1)
                assert not got
                start = trio.current_time()
                await producer.produce({("lp", 0): [b"new"]})
        # Woken by the append, far from the 20 s maxWait.
        assert trio.current_time() - start < 5
    assert [(m.seq, m.value) for m in got[0].messages] == [(2, b"new")]


async def test_max_wait_timeout_is_honoured(client: TankClient, server: RunningServer) -> None:
    await client.create_topic("quiet", 1)
    raw = await raw_client(server)
    for wait_ms in (30, 200):
        start = trio.current_time()
        await raw.send(consume_request(wait_ms, [("quiet", 0, TAIL)], max_wait_ms=wait_ms))
        with trio.fail_after(5):
            reply = await raw.next()
        waited = trio.current_time() - start
        assert wait_ms / 1000 <= waited < wait_ms / 1000 + 0.25
        [part] = reply.response.topics[0].partitions
        assert (part.flags, part.chunk, part.base_seq_num) == (ConsumeFlags.OK, b"", 1)
    await raw.aclose()


async def test_min_bytes(client: TankClient, server: RunningServer) -> None:
    await client.create_topic("mb", 2)
    raw = await raw_client(server)
    await raw.send(consume_request(5, [("mb", 0, TAIL), ("mb", 1, TAIL)],
                                   max_wait_ms=20_000, min_bytes=2000))
    async with open_tank_client(server.host, server.port) as producer:
        await producer.produce({("mb", 0): [b"s" * 100]})
        with trio.move_on_after(0.3) as early:
            await raw.next()
        assert early.cancelled_caught  # 100-odd bytes appended: below minBytes
        await producer.produce({("mb", 1): [os.urandom(2500)]})
        with trio.fail_after(5):
            reply = await raw.next()
    assert reply.request.request_id == 5
    assert [len(p.chunk) > 0 for p in reply.response.topics[0].partitions] == [True, True]
    await raw.aclose()


async def test_data_on_any_partition_answers_at_once(client: TankClient) -> None:
    await client.create_topic("now", 2)
    await client.produce({("now", 1): [b"here"]})
    with trio.fail_after(5):
        results = await client.consume_many({("now", 0): TAIL, ("now", 1): 1},
                                            max_wait_ms=20_000, min_bytes=1 << 20)
    assert [m.value for m in results[("now", 1)].messages] == [b"here"]
    assert results[("now", 0)].messages == []


async def test_waiting_consumes_are_answered_out_of_order(client: TankClient,
                                                          server: RunningServer) -> None:
    await client.create_topic("ooo", 3)
    raw = await raw_client(server)
    await raw.send(consume_request(10, [("ooo", 0, TAIL)], max_wait_ms=20_000),
                   consume_request(11, [("ooo", 1, TAIL)], max_wait_ms=20_000),
                   consume_request(12, [("ooo", 2, TAIL)], max_wait_ms=20_000),
                   StatusRequest(13))
    order = []
    with trio.fail_after(10):
        first = await raw.next()
        order.append(first.request.request_id)  # Status, while the consumes wait
        for partition in (2, 0, 1):
            await client.produce({("ooo", partition): [b"p%d" % partition]})
            reply = await raw.next()
            assert isinstance(reply, Reply)
            order.append(reply.request.request_id)
            [part] = reply.response.topics[0].partitions
            assert part.partition == partition and part.chunk
    assert order == [13, 12, 10, 11]
    await raw.aclose()


async def test_client_pipelines_many_requests(client: TankClient) -> None:
    await client.create_topic("pipe", 4)
    results: dict[int, Any] = {}

    async def waiter(partition: int) -> None:
        results[partition] = await client.consume("pipe", partition, 1, max_wait_ms=20_000)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for partition in range(4):
                nursery.start_soon(waiter, partition)
            await trio.sleep(0.05)
            for i in range(20):
                nursery.start_soon(client.status)
                nursery.start_soon(client.produce, {("pipe", i % 4): [b"%d" % i]})
    assert sorted(len(r.messages) >= 1 for r in results.values()) == [True] * 4


async def test_small_fetch_size_gets_whole_bundles(client: TankClient) -> None:
    values = [os.urandom(2048) for _ in range(10)]  # one ~20 KiB bundle
    await client.produce({("big", 0): values})
    result = await client.consume("big", 0, 4, fetch_size=64)
    assert [m.value for m in result.messages] == values[3:]


class ChunkCuttingBackend:
    """A backend that cuts chunks at the fetch size like TANK 1 (partial last bundle)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.auto_create = inner.auto_create
        self.fetch_sizes: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def fetch_nowait(self, requests: Sequence[FetchRequest]) -> None:
        return None  # every Consume goes through fetch, which cuts the chunks

    async def fetch(self, requests: Sequence[FetchRequest], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        self.fetch_sizes.append([r.fetch_size for r in requests])
        outcomes = await self.inner.fetch(requests, max_wait_ms=max_wait_ms,
                                          min_bytes=min_bytes)
        for request, outcome in zip(requests, outcomes, strict=True):
            if outcome.chunk.length > request.fetch_size:
                data = outcome.chunk.read_bytes()[:request.fetch_size]
                outcome.chunk.close()
                outcome.chunk = BytesChunk(data)
        return outcomes


async def test_client_retries_a_partial_bundle_with_a_larger_fetch(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, durability="os", tank_listen="127.0.0.1:0")
    async with open_embedded_backend(EmbeddedSettings.of(settings)) as embedded:
        backend = ChunkCuttingBackend(embedded)
        async with serving(backend, settings) as server, \
                open_tank_client(server.host, server.port) as client:
            small = [b"s1", b"s2"]
            large = [os.urandom(2048) for _ in range(10)]
            await client.produce({("cut", 0): small})
            await client.produce({("cut", 0): large})
            # The first bundle is whole, the second cut: the messages of the first come back.
            result = await client.consume("cut", 0, 1, fetch_size=1000)
            assert [m.value for m in result.messages] == small
            assert result.next_seq == 3
            # Now the chunk holds only part of the large bundle: the client asks again.
            backend.fetch_sizes.clear()
            result = await client.consume("cut", 0, 3, fetch_size=1000)
            assert [m.value for m in result.messages] == large
            assert len(backend.fetch_sizes) == 2
            assert backend.fetch_sizes[1][0] >= 20 * 1024


@pytest.mark.parametrize("tail_cache", [0, 1 << 20])
async def test_chunks_go_out_with_sendfile_unless_cached(tmp_path: Path, tail_cache: int,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """File ranges go out with sendfile; the newest bundles come from the tail cache."""
    calls: list[int] = []
    real = os.sendfile

    def counting(out: int, fd: int, offset: int | None, count: int) -> int:
        calls.append(count)
        return real(out, fd, offset, count)

    monkeypatch.setattr(gateway.io.writer.os, "sendfile", counting)
    values = [os.urandom(1000) for _ in range(300)]
    async with tank_server(tmp_path / "data", tail_cache_bytes=tail_cache) as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        await client.produce({("sf", 0): values[:150]})
        await client.produce({("sf", 0): values[150:]})
        result = await client.consume("sf", 0, 1, fetch_size=1 << 20)
    assert [m.value for m in result.messages] == values
    assert sum(calls) >= 300_000 if not tail_cache else calls == []


async def test_sparse_first_bundle_is_flagged(client: TankClient,
                                              server: RunningServer) -> None:
    await client.produce({("sp", 0): [Message(b"a", timestamp=1, seq=7),
                                      Message(b"b", timestamp=1, seq=9)]}, sparse=True)
    raw = await raw_client(server)
    await raw.send(consume_request(1, [("sp", 0, 9)]))
    with trio.fail_after(5):
        reply = await raw.next()
    [part] = reply.response.topics[0].partitions
    assert (part.flags, part.high_water_mark) == (ConsumeFlags.SPARSE_FIRST_BUNDLE, 9)
    assert [m.seq for m in (await client.consume("sp", 0, 9)).messages] == [9]
    await raw.aclose()


async def test_consume_version_3_with_flags(client: TankClient, server: RunningServer) -> None:
    await client.produce({("v3", 0): [b"x"]})
    raw = await raw_client(server)
    await raw.send(ConsumeRequest(3, 77, "v3", 0, 0, 0,
                                  [ConsumeTopic("v3", [ConsumePartition(0, 1, 4096)])]))
    with trio.fail_after(5):
        reply = await raw.next()
    assert reply.request.request_id == 77
    assert reply.response.topics[0].partitions[0].chunk
    await raw.aclose()


async def test_fsync_durability_end_to_end(tmp_path: Path) -> None:
    async with tank_server(tmp_path, durability="fsync") as server, \
            open_tank_client(server.host, server.port) as client:
        await client.produce({("d", 0): [b"durable"]})
        assert [m.value for m in (await client.consume("d", 0, 1)).messages] == [b"durable"]



async def test_requests_in_flight_are_bounded_per_connection(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data", max_requests_in_flight=2) as server, \
            open_tank_client(server.host, server.port) as client:
        await _requests_in_flight_are_bounded(client, server)


async def _requests_in_flight_are_bounded(client: TankClient, server: RunningServer) -> None:
    await client.create_topic("bound", 1)
    raw = await raw_client(server)
    await raw.send(consume_request(1, [("bound", 0, TAIL)], max_wait_ms=20_000),
                   consume_request(2, [("bound", 0, TAIL)], max_wait_ms=20_000),
                   StatusRequest(3))
    with trio.move_on_after(0.3) as held:
        await raw.next()
    assert held.cancelled_caught  # two consumes wait; the Status is not admitted yet
    await client.produce({("bound", 0): [b"go"]})
    with trio.fail_after(5):
        ids = sorted([(await raw.next()).request.request_id for _ in range(3)])
    assert ids == [1, 2, 3]
    await raw.aclose()
