"""The blocking Tank client, driven from a worker thread against a live listener."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import trio

from gateway.client.errors import BoundaryError, ClientClosed, TopicExistsError
from gateway.client.tank_blocking import BlockingTankClient
from tests.tank.helpers import RunningServer, tank_server


def script(host: str, port: int) -> list[object]:
    with BlockingTankClient(host, port, request_timeout=10) as client:
        client.create_topic("blk", 2)
        with pytest.raises(TopicExistsError):
            client.create_topic("blk", 2)
        client.produce({("blk", 0): [b"a", (b"k", b"b")], ("blk", 1): [b"c"]})
        client.produce_with_seqnum({("mirror", 0): (10, [b"m"])})
        result = client.consume("blk", 0, 1)
        many = client.consume_many({("blk", 0): 2, ("blk", 1): 0})
        with pytest.raises(BoundaryError):
            client.consume("blk", 0, 99)
        client.reload_conf("blk", 0)
        return [
            [(m.seq, m.key, m.value) for m in result.messages],
            {k: [m.value for m in r.messages] for k, r in many.items()},
            [b.high_water_mark for b in client.discover_partitions("blk")],
            sorted(t.name for t in client.discover_topics()),
            client.status().partitions,
        ]


async def test_blocking_calls(server: RunningServer) -> None:
    with trio.fail_after(20):
        got = await trio.to_thread.run_sync(script, server.host, server.port)
    assert got == [
        [(1, None, b"a"), (2, b"k", b"b")],
        {("blk", 0): [b"b"], ("blk", 1): [b"c"]},
        [2, 1],
        ["blk", "mirror"],
        3,
    ]


def pickled_round_trip(host: str, port: int) -> list[bytes]:
    client = BlockingTankClient(host, port)
    client.produce({("pk", 0): [b"from the driver"]})
    copy = pickle.loads(pickle.dumps(client))  # as a Spark executor receives it
    client.close()
    assert not copy.connected  # connects on first use
    try:
        copy.produce({("pk", 0): [b"from an executor"]})
        return [m.value for m in copy.consume("pk", 0, 1).messages]
    finally:
        copy.close()


async def test_pickled_client_reconnects(server: RunningServer) -> None:
    with trio.fail_after(20):
        got = await trio.to_thread.run_sync(pickled_round_trip, server.host, server.port)
    assert got == [b"from the driver", b"from an executor"]


def survive_idle_close(host: str, port: int) -> int:
    import time

    with BlockingTankClient(host, port) as client:
        client.create_topic("idle", 1)
        time.sleep(0.6)  # the server closes the idle connection meanwhile
        status = client.status()  # a fresh connection
        client.close()
        with pytest.raises(ClientClosed):
            client.status()
        return status.topics


async def test_reconnects_after_the_server_closed(tmp_path: Path) -> None:
    async with tank_server(tmp_path, idle_timeout_secs=0.2) as server:
        with trio.fail_after(20):
            assert await trio.to_thread.run_sync(survive_idle_close, server.host,
                                                 server.port) == 1
