"""A position handed between the Kafka, Figg and Tank client families continues with no
gap and no duplicate (issue 17): the position is the Tank sequence / Figg offset of the
last message read, which is also the Kafka offset to read next."""

from __future__ import annotations

from typing import Any

import trio

from gateway.client.figg_blocking import BlockingFiggClient
from gateway.client.tank_blocking import BlockingTankClient
from tests.kafka.helpers import bootstrap, kafka_server
from tests.kafka.test_real_clients import consume, produce

TOPIC = "handoff"
VALUES = [b"m%d" % i for i in range(1, 10)]  # sequences 1..9, Kafka offsets 0..8


def _figg_from(server: Any, position: int, count: int) -> list[tuple[int, bytes]]:
    """``count`` messages after Figg offset ``position`` (ATTACH resuming after it)."""
    with BlockingFiggClient(*server.figg) as figg:
        figg.wait_connected(timeout=5)
        sub = figg.subscribe(TOPIC, from_offset=position)
        return [(m.offset, m.data) for m in (sub.get(timeout=5) for _ in range(count))]


def _tank_from(server: Any, seq: int, count: int) -> list[tuple[int, bytes]]:
    with BlockingTankClient(*server.tank, request_timeout=5) as tank:
        return [(m.seq, m.value) for m in tank.consume(TOPIC, 0, seq).messages][:count]


def _kafka_from(addr: str, offset: int, count: int) -> list[tuple[int, bytes]]:
    return [(o + 1, v) for o, _, v, _ in consume(addr, TOPIC, offset, count)]  # as seqs


def script(server: Any) -> dict[str, list[tuple[int, bytes]]]:
    addr = bootstrap(server)
    produce(addr, TOPIC, [(None, v) for v in VALUES[:3]])
    with BlockingTankClient(*server.tank, request_timeout=5) as tank:
        tank.produce({(TOPIC, 0): VALUES[3:6]})
    with BlockingFiggClient(*server.figg) as figg:
        figg.wait_connected(timeout=5)
        for value in VALUES[6:]:
            figg.publish_and_wait(TOPIC, value)
    read: dict[str, list[tuple[int, bytes]]] = {}
    # Kafka read offsets 0..3: its position (next offset) is 4, the seq of the last read.
    kafka_read = _kafka_from(addr, 0, 4)
    position = kafka_read[-1][0]
    read["kafka->figg"] = kafka_read + _figg_from(server, position, 9 - position)
    read["kafka->tank"] = kafka_read + _tank_from(server, position + 1, 9)
    # Figg read offsets 1..5: Kafka goes on at offset 5, Tank at sequence 6.
    figg_read = _figg_from(server, 0, 5)
    position = figg_read[-1][0]
    read["figg->kafka"] = figg_read + _kafka_from(addr, position, 9 - position)
    # Tank read sequences 1..2: Kafka goes on at offset 2.
    tank_read = _tank_from(server, 1, 2)
    position = tank_read[-1][0]
    read["tank->kafka"] = tank_read + _kafka_from(addr, position, 9 - position)
    return read


async def test_positions_hand_over_between_kafka_figg_and_tank(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(60):
            read = await trio.to_thread.run_sync(script, server)
    expected = list(zip(range(1, 10), VALUES, strict=True))
    for path, messages in read.items():
        assert messages == expected, path  # every message once, in order
