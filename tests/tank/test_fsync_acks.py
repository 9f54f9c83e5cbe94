"""Acknowledgements in ``fsync`` mode over a real socket and real segment files: a Produce
is answered only once a sync round made its bundle durable (the partition publishes its
high-water mark only then), and pipelined Produces are answered in request order."""

from __future__ import annotations

import struct
from pathlib import Path

import trio

from tests.tank.helpers import tank_server
from tests.tank.test_raw_bytes import frame, one_message_bundle, produce, receive_frame

PRODUCES = 40


async def test_each_ack_follows_the_sync_of_its_data(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data", durability="fsync") as server:
        stream = await trio.open_tcp_stream(server.host, server.port)
        await receive_frame(stream)
        await stream.send_all(produce(0, [("acks", [(0, one_message_bundle(b"first"))])]))
        assert await receive_frame(stream) == frame(0x01, struct.pack("<IB", 0, 0))
        partition = server.backend.store.partition("acks", 0)
        assert partition.high_water_mark == 1
        rounds = partition._commit.rounds

        await stream.send_all(b"".join(
            produce(i, [("acks", [(0, one_message_bundle(b"m%d" % i))])])
            for i in range(1, PRODUCES + 1)))
        for i in range(1, PRODUCES + 1):
            # Answered in request order, each after the round that made it durable.
            assert await receive_frame(stream) == frame(0x01, struct.pack("<IB", i, 0))
            assert partition.high_water_mark >= i + 1
            assert partition._commit.rounds > rounds
        assert partition._commit.pending == 0
        await stream.aclose()
        segments = list((tmp_path / "data" / "acks" / "0").glob("*.log"))
        stored = b"".join(p.read_bytes() for p in segments)
        assert all(b"m%d" % i in stored for i in range(1, PRODUCES + 1))
