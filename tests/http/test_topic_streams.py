"""Whole-topic SSE streams at the tail are fed by each partition's shared reader (one
follower per partition on its tail), in order per partition, and resume exactly once
with Last-Event-ID."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.http.helpers import H11Client, SseReader, http_server, sse_events

PARTITIONS = 3
STREAMS = 4
PER_PARTITION = 10


def followers(server, topic: str) -> list[int]:
    """How many followers each partition's tail feeds now (white box: the tails' own
    bookkeeping is what this test is about)."""
    tails = [server.listener.tails.get(topic, p) for p in range(PARTITIONS)]
    return [0 if tail is None else len(tail._followers) for tail in tails]


def delivered(reader: SseReader) -> list[tuple[str, int, int, str]]:
    out = []
    for event in sse_events(reader.text):
        message = json.loads(event["data"])
        out.append((event["id"], message["partition"], message["offset"], message["value"]))
    return out


async def test_whole_topic_streams_follow_every_partitions_tail(tmp_path: Path) -> None:
    async with http_server(tmp_path, default_partitions=PARTITIONS) as server:
        host, port = server.host, server.port
        writer = await H11Client.connect(host, port)
        status, _, _ = await writer.request("POST", "/topics/wide?partition=0", b"warm")
        assert status == 200
        readers = [await SseReader.open(host, port, "/topics/wide/events")
                   for _ in range(STREAMS)]
        with trio.fail_after(10):
            while followers(server, "wide") != [STREAMS] * PARTITIONS:
                await trio.sleep(0.01)

        async def producer(partition: int) -> None:
            client = await H11Client.connect(host, port)
            for i in range(PER_PARTITION):
                status, _, _ = await client.request(
                    "POST", f"/topics/wide?partition={partition}", f"{partition}-{i}".encode())
                assert status == 200
            await client.aclose()

        async with trio.open_nursery() as nursery:
            for partition in range(PARTITIONS):
                nursery.start_soon(producer, partition)
        total = PARTITIONS * PER_PARTITION
        for reader in readers:
            await reader.read_until(lambda r: len(sse_events(r.text)) >= total)
            got = delivered(reader)
            assert len(got) == total  # once each
            for partition in range(PARTITIONS):
                mine = [(o, v) for _, p, o, v in got if p == partition]
                assert mine == [(o, f"{partition}-{i}") for i, o in enumerate(
                    range(2 if partition == 0 else 1, PER_PARTITION + (2 if partition == 0
                                                                        else 1)))]
            # Each id is every partition's position after its event.
            last_id = got[-1][0]
            assert sorted(last_id.split(",")) == sorted(
                f"{p}:{PER_PARTITION + (1 if p == 0 else 0)}" for p in range(PARTITIONS))
        # Still following (the stream's task slept meanwhile, the readers fed it).
        assert followers(server, "wide") == [STREAMS] * PARTITIONS

        # A stream cut mid-way resumes after its last id, exactly once.
        cut = delivered(readers[0])[total // 2 - 1]
        for reader in readers:
            await reader.client.aclose()
        again = await SseReader.open(host, port, f"/topics/wide/events?last_event_id={cut[0]}")
        await again.read_until(lambda r: len(sse_events(r.text)) >= total - total // 2)
        rest = delivered(again)
        assert sorted((p, o) for _, p, o, _ in rest) == sorted(
            (p, o) for _, p, o, _ in delivered(readers[0])[total // 2:])
        await again.client.aclose()
        await writer.aclose()
