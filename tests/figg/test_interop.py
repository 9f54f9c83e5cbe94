"""Figg and Tank clients over real sockets, one server (both listeners, one backend).

A Figg offset is the Tank sequence number of the message it names, so positions pass
between the two protocols unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from gateway.client.figg import FiggClient, open_figg_client
from gateway.client.tank import FIRST_AVAILABLE, TankClient, open_tank_client
from gateway.core.config import Settings
from gateway.server.run import open_server
from protocols.tank.bundle import Codec, Message
from tests.figg.helpers import open_test_backend

FAST = {"backoff": lambda attempt: 0.0 if attempt == 0 else 0.02, "ping_interval": 1.0}


@dataclass
class Gateway:
    backend: Any
    figg_port: int
    tank_port: int

    @asynccontextmanager
    async def figg(self) -> AsyncIterator[FiggClient]:
        async with open_figg_client("127.0.0.1", self.figg_port, **FAST) as client:
            yield client

    @asynccontextmanager
    async def tank(self) -> AsyncIterator[TankClient]:
        async with open_tank_client("127.0.0.1", self.tank_port) as client:
            yield client


@asynccontextmanager
async def gateway(tmp_path: Any, **settings: Any) -> AsyncIterator[Gateway]:
    """Both listeners on 127.0.0.1 (ephemeral ports) over one embedded store."""
    config = Settings(figg_listen="127.0.0.1:0", tank_listen="127.0.0.1:0", metrics_listen="",
                      kafka_listen="", http_listen="", **settings)
    async with open_test_backend(tmp_path, **settings) as backend, \
            open_server(config, backend=backend, grace=0.2) as server:
        assert server.figg and server.tank
        yield Gateway(backend, server.figg[1], server.tank[1])


async def tank_read_all(tank: TankClient, topic: str, partition: int = 0, seq: int = 1,
                        until: int | None = None) -> list[Message]:
    """Consume from ``seq`` up to the high-water mark (or ``until``)."""
    out: list[Message] = []
    while True:
        result = await tank.consume(topic, partition, seq, max_wait_ms=0)
        out += result.messages
        seq = result.next_seq
        end = result.high_water_mark if until is None else until
        if seq > end:
            return [m for m in out if until is None or m.seq <= until]


async def figg_read(sub: Any, count: int) -> list[Any]:
    return [await sub.receive() for _ in range(count)]


async def test_figg_publish_tank_consume_same_payloads_and_positions(tmp_path):
    with trio.fail_after(15):
        async with gateway(tmp_path) as gw, gw.figg() as figg, gw.tank() as tank:
            sub = await figg.subscribe("fx", from_offset=0)
            values = [b"figg-%d" % i for i in range(500)]
            for v in values:
                await figg.publish("fx", v)
            await figg.wait_all_acked()
            delivered = await figg_read(sub, 500)
            consumed = await tank_read_all(tank, "fx")
    assert [m.value for m in consumed] == values
    assert [(m.seq, m.value) for m in consumed] == [(d.offset, d.data) for d in delivered]
    assert [m.seq for m in consumed] == list(range(1, 501))


async def test_tank_produce_figg_data_carries_sequence_numbers(tmp_path):
    with trio.fail_after(15):
        async with gateway(tmp_path) as gw, gw.figg() as figg, gw.tank() as tank:
            await tank.create_topic("tx", 3)
            sub0 = await figg.subscribe("tx", from_offset=0)
            sub2 = await figg.subscribe("tx/2", from_offset=0)
            for round_ in range(5):
                await tank.produce({("tx", 0): [b"p0-%d-%d" % (round_, i) for i in range(7)],
                                    ("tx", 2): [b"p2-%d" % round_]})
            got0 = await figg_read(sub0, 35)
            got2 = await figg_read(sub2, 5)
            tank0 = await tank_read_all(tank, "tx", 0)
            tank2 = await tank_read_all(tank, "tx", 2)
    assert [(d.offset, d.data) for d in got0] == [(m.seq, m.value) for m in tank0]
    assert [(d.offset, d.data) for d in got2] == [(m.seq, m.value) for m in tank2]
    assert {d.topic for d in got2} == {"tx/2"}


async def test_figg_stops_at_x_tank_continues_at_x_plus_1(tmp_path):
    with trio.fail_after(15):
        async with gateway(tmp_path) as gw, gw.figg() as figg, gw.tank() as tank:
            await tank.produce({("hand", 0): [b"m%d" % i for i in range(1, 101)]})
            sub = await figg.subscribe("hand", from_offset=0)
            first = await figg_read(sub, 40)
            await sub.aclose()
            x = sub.last_offset
            assert x == first[-1].offset == 40
            # A Tank consumer picks up at X + 1 with the position unchanged.
            rest = await tank_read_all(tank, "hand", seq=x + 1)
    assert [m.seq for m in rest] == list(range(41, 101))
    assert [d.data for d in first] + [m.value for m in rest] == [
        b"m%d" % i for i in range(1, 101)]


async def test_tank_stops_at_s_figg_resumes_after_s(tmp_path):
    with trio.fail_after(15):
        async with gateway(tmp_path) as gw, gw.figg() as figg, gw.tank() as tank:
            await tank.produce({("back", 0): [b"m%d" % i for i in range(1, 51)]})
            part = await tank_read_all(tank, "back", seq=FIRST_AVAILABLE, until=20)
            s = part[-1].seq
            sub = await figg.subscribe("back", from_offset=s)
            assert sub.start_offset == s
            await tank.produce({("back", 0): [b"m%d" % i for i in range(51, 61)]})
            rest = await figg_read(sub, 40)
    assert s == 20
    assert [d.offset for d in rest] == list(range(21, 61))
    assert [m.value for m in part] + [d.data for d in rest] == [
        b"m%d" % i for i in range(1, 61)]


async def test_keyed_and_compressed_tank_messages_reach_figg_intact(tmp_path):
    big = bytes(range(256)) * 40  # compressible, over Tank's 1024-byte rule
    with trio.fail_after(15):
        async with gateway(tmp_path) as gw, gw.figg() as figg, gw.tank() as tank:
            sub = await figg.subscribe("kc", from_offset=0)
            keyed = [Message(b"v%d" % i, key=b"k%d" % i) for i in range(5)]
            await tank.produce({("kc", 0): keyed}, codec=Codec.NONE)
            await tank.produce({("kc", 0): [(b"key", big), big, (None, b"tiny")]},
                               codec=Codec.SNAPPY)
            await tank.produce({("kc", 0): [b"x%d" % i for i in range(600)]})  # >512: snappy
            sparse = [Message(b"s%d" % seq, seq=seq) for seq in (700, 703, 710)]
            await tank.produce({("kc", 0): sparse}, sparse=True, codec=Codec.SNAPPY)
            got = await figg_read(sub, 5 + 3 + 600 + 3)
            consumed = await tank_read_all(tank, "kc")
    assert [d.data for d in got[:5]] == [b"v%d" % i for i in range(5)]
    assert [d.data for d in got[5:8]] == [big, big, b"tiny"]
    assert [d.data for d in got[8:608]] == [b"x%d" % i for i in range(600)]
    assert [(d.offset, d.data) for d in got[608:]] == [(700, b"s700"), (703, b"s703"),
                                                       (710, b"s710")]
    assert [(d.offset, d.data) for d in got] == [(m.seq, m.value) for m in consumed]


async def test_live_interleaving_of_both_protocols(tmp_path):
    """Figg and Tank producers interleave; both kinds of reader see the same log."""
    with trio.fail_after(20):
        async with gateway(tmp_path) as gw, gw.figg() as figg, gw.tank() as tank:
            sub = await figg.subscribe("mix")

            async def figg_side() -> None:
                for i in range(300):
                    await figg.publish("mix", b"F%d" % i)
                await figg.wait_all_acked()

            async def tank_side() -> None:
                for i in range(30):
                    await tank.produce({("mix", 0): [b"T%d-%d" % (i, j) for j in range(10)]})
                    await trio.sleep(0.001)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(figg_side)
                nursery.start_soon(tank_side)
            got = await figg_read(sub, 600)
            consumed = await tank_read_all(tank, "mix")
    assert [(d.offset, d.data) for d in got] == [(m.seq, m.value) for m in consumed]
    assert [d.data for d in got if d.data.startswith(b"F")] == [b"F%d" % i for i in range(300)]
