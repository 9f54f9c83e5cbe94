"""Quotas enforced by delaying, on loopback (issue 16, quotas items 2 and 3): a Figg
publisher, a Tank producer and Tank and Figg readers under a quota are slowed down, and
everything is acknowledged and delivered, on one connection, with nothing refused; the
connections of one principal share its buckets, principals have their own; new rules
apply to open connections; a connection held back by its quota is not idle.

Timing is only asserted as a lower bound a quota must impose (the data can not go faster
than the rate allows) or, for a reload, with a wide margin; how close to the rate a client
gets is measured by ``python -m gateway.bench.quota``."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway.auth.quotas import QuotaRules, parse_quotas
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from gateway.core.config import Settings
from gateway.server.run import ServerInfo, open_server

SIZE = 10_000  # bytes per message
COUNT = 40  # messages: 400 kB
RATE = 200_000  # bytes a second
BURST = 20_000
#: The least time COUNT messages can take at RATE after the burst (with a margin).
LEAST_SECS = 0.75 * (COUNT * SIZE - BURST) / RATE


@asynccontextmanager
async def serving(tmp_path: Path, rules: list[dict[str, Any]], **settings: Any
                  ) -> AsyncIterator[ServerInfo]:
    """Figg and Tank on loopback ports, with ``rules`` as the quotas in force."""
    config = Settings(data_dir=tmp_path / "data", durability="os",
                      figg_listen="127.0.0.1:0", tank_listen="127.0.0.1:0", metrics_listen="",
                      kafka_listen="", http_listen="", **settings)
    async with open_server(config, grace=0.2, quotas=parse_quotas(rules)) as server:
        yield server


def metric(server: ServerInfo, text: str) -> float:
    for line in server.metrics_registry.render().decode().splitlines():
        if line.startswith(text + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def delayed(server: ServerInfo, direction: str) -> float:
    return metric(server, f'figtank_quota_delay_seconds_total{{direction="{direction}"}}')


def closes(server: ServerInfo) -> float:
    return sum(metric(server, f'figtank_connections_closed_total{{protocol="{p}",'
                              f'reason="{r}"}}')
               for p in ("figg", "tank") for r in ("idle", "frame_timeout", "protocol_error"))


def payloads(n: int = COUNT, size: int = SIZE) -> list[bytes]:
    """Values that do not compress (Tank clients compress bundles that do)."""
    rng = random.Random(n)
    return [rng.randbytes(size) for _ in range(n)]


async def read_all(server: ServerInfo, topic: str, n: int, fetch_size: int = 1 << 20
                   ) -> list[bytes]:
    """The values of ``topic``'s first ``n`` messages, read with Tank."""
    assert server.tank is not None
    values: list[bytes] = []
    async with open_tank_client(*server.tank) as client:
        seq = 1
        while len(values) < n:
            result = await client.consume(topic, 0, seq, fetch_size=fetch_size)
            values += [m.value for m in result.messages]
            seq = result.next_seq
    return values


async def preload(server: ServerInfo, topic: str, values: list[bytes]) -> None:
    assert server.tank is not None
    async with open_tank_client(*server.tank) as client:
        for value in values:
            await client.produce({(topic, 0): [value]})


FETCH = 64 * 1024
IN_RULE = {"bytes_in_per_sec": RATE, "burst_bytes_in": BURST}
OUT_RULE = {"bytes_out_per_sec": RATE, "burst_bytes_out": BURST}


async def test_a_figg_publisher_is_delayed_not_refused(tmp_path: Path) -> None:
    async with serving(tmp_path, [{"who": ["listener:figg"], **IN_RULE}]) as server:
        assert server.figg is not None
        sent = payloads()
        async with open_figg_client(*server.figg, window=1000) as client:
            start = trio.current_time()
            for value in sent:
                await client.publish("pub", value)
            await client.wait_all_acked()
            elapsed = trio.current_time() - start
            assert client.connections == 1
        assert elapsed >= LEAST_SECS, elapsed
        assert await read_all(server, "pub", COUNT) == sent
        assert delayed(server, "in") >= LEAST_SECS * 0.5
        assert metric(server, 'figtank_limit_hits_total{limit="quota"}') >= 1
        assert closes(server) == 0


async def test_a_tank_producer_is_delayed_not_refused(tmp_path: Path) -> None:
    async with serving(tmp_path, [{"who": ["listener:tank"], **IN_RULE}]) as server:
        assert server.tank is not None
        sent = payloads()
        async with open_tank_client(*server.tank) as client:
            start = trio.current_time()
            async with trio.open_nursery() as nursery:  # pipelined, in two runs
                for half in (sent[:COUNT // 2], sent[COUNT // 2:]):
                    nursery.start_soon(client.produce, {("prod", 0): half})
                    await trio.sleep(0)
            elapsed = trio.current_time() - start
        assert elapsed >= LEAST_SECS, elapsed
        assert sorted(await read_all(server, "prod", COUNT)) == sorted(sent)
        assert delayed(server, "in") > 0
        assert metric(server, 'figtank_limit_hits_total{limit="quota"}') >= 1
        assert closes(server) == 0


async def test_a_tank_requests_quota(tmp_path: Path) -> None:
    rule = {"who": ["*"], "requests_per_sec": 20, "burst_requests": 5}
    async with serving(tmp_path, [rule]) as server:
        assert server.tank is not None
        async with open_tank_client(*server.tank) as client:
            start = trio.current_time()
            for i in range(25):
                await client.produce({("req", 0): [b"%d" % i]})
            elapsed = trio.current_time() - start
        assert elapsed >= 0.75 * (25 - 5) / 20, elapsed
        assert await read_all(server, "req", 25) == [b"%d" % i for i in range(25)]


async def test_a_tank_consumer_is_delayed(tmp_path: Path) -> None:
    async with serving(tmp_path, [{"who": ["listener:tank"], **OUT_RULE}]) as server:
        assert server.tank is not None
        sent = payloads()
        await preload(server, "out", sent)  # bytes out only: producing is not held
        assert delayed(server, "out") == 0
        start = trio.current_time()
        got = await read_all(server, "out", COUNT, fetch_size=FETCH)
        elapsed = trio.current_time() - start
        assert got == sent
        # The last Consume's debt is not waited for.
        assert elapsed >= 0.75 * (COUNT * SIZE - BURST - FETCH) / RATE, elapsed
        assert delayed(server, "out") > 0
        assert closes(server) == 0


async def test_a_figg_subscriber_is_delayed(tmp_path: Path) -> None:
    async with serving(tmp_path, [{"who": ["listener:figg"], **OUT_RULE}]) as server:
        assert server.figg is not None
        sent = payloads()
        await preload(server, "sub", sent)
        async with open_figg_client(*server.figg) as client:
            start = trio.current_time()
            sub = await client.subscribe("sub", from_offset=0)
            got = [await sub.receive() for _ in range(COUNT)]
            elapsed = trio.current_time() - start
            assert client.connections == 1
        assert [m.data for m in got] == sent
        assert [m.offset for m in got] == list(range(1, COUNT + 1))
        assert elapsed >= LEAST_SECS * 0.5, elapsed  # a fetch is 256 kB: debt after it
        assert delayed(server, "out") > 0
        assert closes(server) == 0


async def test_a_principals_connections_share_its_buckets(tmp_path: Path) -> None:
    rule = {"who": ["*"], "bytes_in_per_sec": RATE // 2, "burst_bytes_in": BURST // 2}
    async with serving(tmp_path, [rule]) as server:
        assert server.tank is not None and server.figg is not None
        sent = payloads(COUNT // 2)  # 200 kB on each of two connections: 400 kB shared
        async with open_tank_client(*server.tank) as one, \
                open_tank_client(*server.tank) as two:
            await one.discover_topics()
            await two.discover_topics()
            shared = server.quotas.get("listener:tank")
            assert shared is not None and shared.users == 2
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one.produce, {("a", 0): sent})
                nursery.start_soon(two.produce, {("b", 0): sent})
            elapsed = trio.current_time() - start
            # Alone, each would take half as long: they shared one bucket.
            assert elapsed >= 0.75 * (COUNT * SIZE - BURST // 2) / (RATE // 2), elapsed
            # Another principal (the Figg listener) has its own, full bucket.
            async with open_figg_client(*server.figg) as figg:
                await figg.publish_and_wait("c", b"x")
                own = server.quotas.get("listener:figg")
                assert own is not None and own is not shared
                assert own.bytes_in is not None and own.bytes_in.tokens > BURST // 2 - 1000
        with trio.fail_after(5):  # dropped once its connections end (after their debt)
            while server.quotas.get("listener:tank") is not None:
                await trio.sleep(0.05)
        assert await read_all(server, "a", len(sent)) == sent
        assert await read_all(server, "b", len(sent)) == sent


async def test_new_rules_apply_to_open_connections(tmp_path: Path) -> None:
    slow = [{"who": ["listener:tank"], "bytes_in_per_sec": 20_000, "burst_bytes_in": 4096}]
    async with serving(tmp_path, slow) as server:
        assert server.tank is not None
        async with open_tank_client(*server.tank) as client:
            done = trio.Event()

            async def produce() -> None:
                await client.produce({("r", 0): [os.urandom(100_000)]})  # 5 s at 20 kB/s
                done.set()

            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(produce)
                await trio.sleep(0.5)
                assert not done.is_set()
                server.quotas.replace_rules(QuotaRules())  # what a reload does
            assert trio.current_time() - start < 3.0
            # The other way: a quota for a connection that had none.
            server.quotas.replace_rules(parse_quotas(
                [{"who": ["*"], "bytes_in_per_sec": RATE, "burst_bytes_in": BURST}]))
            start = trio.current_time()
            await client.produce({("r", 0): payloads()})
            assert trio.current_time() - start >= LEAST_SECS
        assert len(await read_all(server, "r", COUNT + 1)) == COUNT + 1


async def test_a_connection_held_back_by_its_quota_is_not_idle(tmp_path: Path) -> None:
    # Each read of 20 kB costs a second; idle after half a second without a request.
    rule = [{"who": ["*"], "bytes_in_per_sec": 20_000, "burst_bytes_in": 20_000}]
    async with serving(tmp_path, rule, idle_timeout_secs=0.5) as server:
        assert server.tank is not None
        big = os.urandom(39_000)
        async with open_tank_client(*server.tank) as client:
            await client.produce({("idle", 0): [big]})  # acked with ~1 s of debt
            start = trio.current_time()
            await client.produce({("idle", 0): [b"z"]})  # read once the debt is paid
            assert trio.current_time() - start >= 0.5
        assert closes(server) == 0
        assert await read_all(server, "idle", 2) == [big, b"z"]


async def test_the_access_files_quotas_apply_and_reload(tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text('[[quota]]\nwho = ["listener:tank"]\nbytes_in_per_sec = 1000\n')
    config = Settings(data_dir=tmp_path / "data", durability="os", figg_listen="",
                      tank_listen="127.0.0.1:0", metrics_listen="", kafka_listen="", http_listen="",
                      policy_file=policy)
    async with open_server(config, grace=0.2) as server:
        assert server.tank is not None
        async with open_tank_client(*server.tank) as client:
            await client.discover_topics()
            state = server.quotas.get("listener:tank")
            assert state is not None and state.bytes_in is not None
            assert state.bytes_in.rate.per_sec == 1000
            policy.write_text('[[quota]]\nwho = ["*"]\nbytes_out_per_sec = 5\n')
            assert server.reload()  # what SIGHUP does
            assert state.bytes_in is None and state.out_limited
            policy.write_text('[[quota]]\nwho = ["*"]\nbytes_out_per_sec = -5\n')
            assert not server.reload()  # a bad file keeps the quotas in force
            assert state.out_limited
