"""The bridge backend against an embedded figtank upstream: sharing, merging, creating
topics, outages, address order, keepalive."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.backend.bridge import (
    BridgeBackend,
    BridgeSettings,
    UpstreamUnavailable,
    open_bridge_backend,
)
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from gateway.core.config import Settings
from gateway.core.contract import (
    Backend,
    CreateTopicCode,
    FetchRequest,
    FetchStatus,
    ProduceBatch,
    ProduceCode,
    ReloadConfCode,
)
from gateway.core.metrics import Metrics
from protocols.tank.bundle import Message, decode_chunk, encode_bundle
from tests.bridge.helpers import address, bridge_server, free_port, upstream_server

FAST = {"backoff": lambda attempt: 0.0 if attempt == 0 else 0.05, "connect_timeout": 2.0}


def bundle(*values: bytes) -> bytes:
    return encode_bundle([Message(v, timestamp=1000) for v in values])


def values_of(outcome) -> list[tuple[int, bytes]]:
    chunk = decode_chunk(outcome.chunk.read_bytes(), outcome.base_seq)
    return [(m.seq, m.value) for m in chunk.messages]


def bridge_settings(*upstream: str, **overrides) -> BridgeSettings:
    return BridgeSettings.of(Settings(upstream=upstream, **overrides))


def test_bridge_backend_satisfies_the_protocol() -> None:
    def accepts(b: Backend) -> None:
        del b
    accepts(BridgeBackend.__new__(BridgeBackend))


async def test_produce_and_fetch_outcomes(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                open_bridge_backend(bridge_settings(address(up.tank)), Metrics()) as backend:
            assert await backend.create_topic("two", 2) is CreateTopicCode.OK
            outcomes = await backend.produce([
                ProduceBatch("two", 0, bundle(b"a", b"b")),
                ProduceBatch("two", 0, bundle(b"c")),
                ProduceBatch("two", 5, bundle(b"x")),
                ProduceBatch("two", 1, b"\xff\x00garbage"),
                ProduceBatch("bad/name", 0, bundle(b"x")),
                ProduceBatch("two", 1, bundle(b"d", b"e"), base_seq=10),
            ])
            assert [o.code for o in outcomes] == [
                ProduceCode.OK, ProduceCode.OK, ProduceCode.UNKNOWN_PARTITION,
                ProduceCode.IO_FAULT, ProduceCode.UNKNOWN_TOPIC, ProduceCode.OK]
            assert (outcomes[5].first_seq, outcomes[5].last_seq) == (10, 11)
            fetched = await backend.fetch([
                FetchRequest("two", 0, 2, 1024), FetchRequest("two", 1, 10, 1024),
                FetchRequest("two", 0, 9, 1024), FetchRequest("nope", 0, 1, 1024),
                FetchRequest("two", 7, 1, 1024)], max_wait_ms=0, min_bytes=0)
            assert [o.status for o in fetched] == [
                FetchStatus.DATA, FetchStatus.DATA, FetchStatus.BOUNDARY,
                FetchStatus.UNKNOWN_TOPIC, FetchStatus.UNKNOWN_PARTITION]
            assert values_of(fetched[0]) == [(1, b"a"), (2, b"b"), (3, b"c")]
            assert fetched[0].high_water_mark == 3
            assert values_of(fetched[1]) == [(10, b"d"), (11, b"e")]
            assert (fetched[2].first_available, fetched[2].high_water_mark) == (1, 3)
            assert await backend.reload_conf("two", 0) is ReloadConfCode.OK
            assert await backend.reload_conf("nope", 0) is ReloadConfCode.UNKNOWN_TOPIC
            infos = await backend.discover_partitions("two")
            assert infos is not None
            assert [(i.first_available, i.high_water_mark) for i in infos] == [(1, 3), (10, 11)]


async def test_identical_fetches_share_one_upstream_long_poll(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                open_bridge_backend(bridge_settings(address(up.tank)), Metrics()) as backend:
            await backend.produce([ProduceBatch("live", 0, bundle(b"old"))])
            results: list = []

            async def wait(max_wait_ms: int) -> None:
                [outcome] = await backend.fetch([FetchRequest("live", 0, 2, 65536)],
                                                max_wait_ms=max_wait_ms, min_bytes=1)
                results.append(values_of(outcome))

            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(wait, 10_000)
                await trio.sleep(0.2)
                # A fetch that may not wait as long gets a request of its own.
                [short] = await backend.fetch([FetchRequest("live", 0, 2, 65536)],
                                              max_wait_ms=50, min_bytes=1)
                assert short.status is FetchStatus.DATA and not short.chunk.length
                await backend.produce([ProduceBatch("live", 0, bundle(b"new"))])
            assert results == [[(2, b"new")]] * 10
            assert backend.fetches.joined == 9
            assert backend.fetches.requests == 2


async def test_a_shared_wait_that_runs_out_early_is_resumed(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                open_bridge_backend(bridge_settings(address(up.tank)), Metrics()) as backend:
            await backend.create_topic("quiet", 1)
            request = [FetchRequest("quiet", 0, 1, 1024)]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: backend.fetch(request, max_wait_ms=300, min_bytes=1))
                await trio.sleep(0.1)
                started = trio.current_time()
                [outcome] = await backend.fetch(request, max_wait_ms=600, min_bytes=1)
            waited = trio.current_time() - started
            assert outcome.status is FetchStatus.DATA and not outcome.chunk.length
            assert 0.55 < waited < 1.5  # its own 600 ms, not the first caller's 300


async def test_a_cancelled_fetch_cancels_the_upstream_request(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                open_bridge_backend(bridge_settings(address(up.tank)), Metrics()) as backend:
            await backend.create_topic("quiet", 1)
            with trio.move_on_after(0.2):
                await backend.fetch([FetchRequest("quiet", 0, 1, 1024)], max_wait_ms=30_000,
                                    min_bytes=1)
            await trio.sleep(0.05)
            assert not backend.fetches._in_flight


async def test_concurrent_produces_go_upstream_in_one_request(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                open_bridge_backend(bridge_settings(address(up.tank)), Metrics()) as backend:
            await backend.create_topic("many", 8)
            sent: list[int] = []
            client = await backend.upstream.wait_client(trio.current_time() + 5)
            assert client is not None
            real = client.produce_raw

            async def counting(entries, **kwargs):
                sent.append(len(entries))
                return await real(entries, **kwargs)

            client.produce_raw = counting  # type: ignore[method-assign]
            async with trio.open_nursery() as nursery:
                for p in range(8):
                    nursery.start_soon(backend.produce,
                                       [ProduceBatch("many", p, bundle(b"%d" % p))])
            assert sent == [8]
            infos = await backend.discover_partitions("many")
            assert infos is not None and [i.high_water_mark for i in infos] == [1] * 8


async def test_topics_missing_upstream_are_created_there(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up", auto_create_topics=False) as up, \
                bridge_server(address(up.tank), default_partitions=3) as bridge, \
                open_tank_client(*up.tank, request_timeout=5) as direct:
            async with open_figg_client(*bridge.figg) as figg:
                await figg.publish_and_wait("fresh", b"hello")
                sub = await figg.subscribe("attached/2", from_offset=0)
                assert sub.start_offset == 0
            async with open_tank_client(*bridge.tank, request_timeout=5) as client:
                await client.produce({("tanked", 1): [b"x"]})
            bounds = {t.name: t.partitions for t in await direct.discover_topics()}
            assert bounds == {"fresh": 3, "attached": 3, "tanked": 3}
            assert [m.value for m in (await direct.consume("fresh", 0, 1)).messages] == [
                b"hello"]


async def test_no_auto_create_keeps_upstream_answers(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up", auto_create_topics=False) as up, \
                open_bridge_backend(bridge_settings(address(up.tank),
                                                    auto_create_topics=False),
                                    Metrics()) as backend:
            [outcome] = await backend.produce([ProduceBatch("absent", 0, bundle(b"x"))])
            assert outcome.code is ProduceCode.UNKNOWN_TOPIC
            assert await backend.discover_partitions("absent") is None


async def test_upstream_down_then_up(tmp_path: Path) -> None:
    port = free_port()
    metrics = Metrics()
    with trio.fail_after(20):
        async with open_bridge_backend(bridge_settings(f"127.0.0.1:{port}"), metrics,
                                       upstream_options=FAST, wait_secs=0.3) as backend:
            assert not backend.upstream.upstream_up
            started = trio.current_time()
            [outcome] = await backend.produce([ProduceBatch("t", 0, bundle(b"lost"))])
            assert outcome.code is ProduceCode.IO_FAULT
            assert 0.25 < trio.current_time() - started < 2
            [fault] = await backend.fetch([FetchRequest("t", 0, 1, 1024)], max_wait_ms=100,
                                          min_bytes=1)
            assert fault.status is FetchStatus.FAULT
            assert await backend.create_topic("t", 1) is CreateTopicCode.SYSTEM_ERROR
            with pytest.raises(UpstreamUnavailable):
                await backend.discover_topics()
            assert metrics.upstream_up._value.get() == 0
            assert metrics.upstream_outages._value.get() == 1

            async with upstream_server(tmp_path / "up", tank_listen=f"127.0.0.1:{port}"):
                # A fetch waiting for the upstream goes on once it is there.
                [waited] = await backend.fetch([FetchRequest("t", 0, 1, 1024)],
                                               max_wait_ms=5000, min_bytes=1)
                assert waited.status is FetchStatus.UNKNOWN_TOPIC
                [outcome] = await backend.produce([ProduceBatch("t", 0, bundle(b"kept"))])
                assert outcome.code is ProduceCode.OK
                assert backend.upstream.upstream_up
                assert metrics.upstream_up._value.get() == 1
            # The upstream stopped: one more outage.
            with trio.fail_after(5):
                while backend.upstream.upstream_up:
                    await trio.sleep(0.01)
            assert metrics.upstream_outages._value.get() == 2
            assert metrics.upstream_up._value.get() == 0


async def test_addresses_are_tried_in_order(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "a") as a, upstream_server(tmp_path / "b") as b:
            settings = bridge_settings(dead, address(b.tank), address(a.tank))
            async with open_bridge_backend(settings, Metrics(),
                                           upstream_options=FAST) as backend:
                assert backend.upstream.address == address(b.tank)
                await backend.produce([ProduceBatch("t", 0, bundle(b"to b"))])
                b.request_shutdown()
                # b is gone: the next working address in the list takes over.
                with trio.fail_after(5):
                    while backend.upstream.address != address(a.tank):
                        await trio.sleep(0.01)
                [outcome] = await backend.produce([ProduceBatch("t", 0, bundle(b"to a"))])
                assert outcome.code is ProduceCode.OK
                assert backend.upstream.outages == 1


async def test_keepalive_holds_an_idle_connection(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up", idle_timeout_secs=0.3) as up, \
                open_bridge_backend(bridge_settings(address(up.tank)), Metrics(),
                                    upstream_options={"keepalive_secs": 0.1}) as backend:
            await trio.sleep(1.0)
            assert backend.upstream.upstream_up
            assert backend.upstream.outages == 0


async def test_a_broker_that_drops_every_connection_is_backed_off() -> None:
    accepted = 0

    async def greet_and_hang_up(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await stream.send_all(b"\x03\x00\x00\x00\x00")  # Tank's greeting Ping
        await stream.aclose()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(
                lambda task_status: trio.serve_tcp(greet_and_hang_up, 0, host="127.0.0.1",
                                                   task_status=task_status))
            port = listener.socket.getsockname()[1]
            async with open_bridge_backend(bridge_settings(f"127.0.0.1:{port}"),
                                           Metrics()) as backend:
                await trio.sleep(1.0)
                # 0, 0.1, 0.2, 0.4 s (with jitter) apart: a handful, not a busy loop.
                assert 2 <= accepted <= 6
                assert not backend.upstream.upstream_up
            nursery.cancel_scope.cancel()


async def test_long_polls_travel_on_consume_connections(tmp_path: Path) -> None:
    options = {"consumes_per_connection": 2, "max_consume_connections": 3}
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up, \
                open_bridge_backend(bridge_settings(address(up.tank)), Metrics(),
                                    upstream_options=options) as backend:
            await backend.create_topic("wide", 8)
            upstream = backend.upstream
            got: list[int] = []

            async def park(partition: int) -> None:
                [outcome] = await backend.fetch([FetchRequest("wide", partition, 1, 1024)],
                                                max_wait_ms=10_000, min_bytes=1)
                got.append(len(values_of(outcome)))

            async with trio.open_nursery() as nursery:
                for partition in range(8):
                    nursery.start_soon(park, partition)
                await trio.sleep(0.3)
                # Two per connection; past three connections the least loaded takes more.
                assert upstream.consume_connections == 3
                assert sorted(upstream._load.values()) == [2, 3, 3]
                # Appends are not queued behind the parked long polls.
                started = trio.current_time()
                outcomes = await backend.produce([ProduceBatch("wide", p, bundle(b"x"))
                                                  for p in range(8)])
                assert all(o.code is ProduceCode.OK for o in outcomes)
                assert trio.current_time() - started < 1
            assert got == [1] * 8
            # The consume connections end with the main one.
            client = await upstream.wait_client(trio.current_time() + 1)
            assert client is not None
            await upstream.discard(client, "test")
            with trio.fail_after(5):
                while upstream.consume_connections:
                    await trio.sleep(0.01)
