"""``/metrics`` off the event loop's critical path (issue 15, item 4): a rendering runs in a
worker thread while the loop keeps serving, concurrent and back-to-back scrapes share one,
and scrapers that flood the endpoint or never read are bounded. Real sockets on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from structlog.testing import capture_logs

from gateway.core.config import Settings
from gateway.core.metrics import GaugeCollector, Metrics
from gateway.server.endpoint import Endpoint, serve_endpoint
from gateway.server.rendering import REUSE_SECS
from gateway.server.run import open_server
from protocols.figg.records import encode_ping_frame, encode_pong_frame
from tests.figg.memory_backend import MemoryBackend
from tests.test_http_endpoint import Peer, get


class CountingCollector(Collector):
    """Counts the renderings it is part of; each takes ``delay`` seconds (in whatever
    thread renders), so that scrapes arriving together overlap."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.renderings = 0

    def collect(self) -> Iterable[GaugeMetricFamily]:
        self.renderings += 1
        time.sleep(self.delay)
        yield GaugeMetricFamily("test_renderings", "Renderings so far.", self.renderings)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


def big_registry(topics: int) -> Metrics:
    """A registry with per-topic series for ``topics`` topics (about 250 bytes each)."""
    metrics = Metrics(metric_topics=topics)
    for i in range(topics):
        metrics.appended(f"topic-{i:05d}", 1, 100)
    return metrics


@asynccontextmanager
async def served(metrics: Metrics, **settings: object
                 ) -> AsyncIterator[tuple[tuple[str, int], tuple[str, int]]]:
    """A server counting in ``metrics``: where its HTTP endpoint and Figg listener are."""
    config = Settings(figg_listen="127.0.0.1:0", tank_listen="",
                      metrics_listen="127.0.0.1:0", kafka_listen="", http_listen="", **settings)  # type: ignore[arg-type]
    async with open_server(config, backend=MemoryBackend(), metrics=metrics, grace=0) as info:
        assert info.metrics is not None and info.figg is not None
        yield info.metrics, info.figg


async def ping(address: tuple[str, int]) -> bytes:
    """One Figg PING on a new connection; the answer's 16 bytes."""
    async with await trio.open_tcp_stream(*address) as stream:
        await stream.send_all(encode_ping_frame(7))
        got = b""
        while len(got) < 16:
            data = await stream.receive_some(16 - len(got))
            assert data, "the server closed the connection"
            got += data
        return got


async def test_the_loop_serves_others_while_a_rendering_is_under_way() -> None:
    metrics = Metrics()
    started, release = threading.Event(), threading.Event()
    released: list[bool] = []

    def blocked_until_released() -> list[tuple[list[str], float]]:
        started.set()
        # Rendered on the event loop, nothing could release it: it gives up after 5 s.
        released.append(release.wait(timeout=5))
        return [([], 1.0)]

    metrics.add_collector(GaugeCollector("test_slow", "Blocks its rendering.", [],
                                         blocked_until_released))
    with trio.fail_after(15):
        async with served(metrics) as (address, figg):
            scraper = await Peer.connect(address)
            await scraper.send(get("/metrics"))
            assert await trio.to_thread.run_sync(started.wait, 5)
            # The rendering is blocked: the loop still answers /health and a Figg PING.
            health = await Peer.connect(address)
            await health.send(get("/health"))
            assert (await health.response())[::2] == (200, b"ready\n")
            assert await ping(figg) == encode_pong_frame(7)
            release.set()
            status, _, body = await scraper.response()
            assert status == 200 and b"\ntest_slow 1.0\n" in body
    assert released == [True]


async def test_concurrent_scrapes_share_one_rendering_reused_for_a_while() -> None:
    metrics = Metrics()
    counting = CountingCollector(delay=0.3)
    metrics.add_collector(counting)
    # reuse_secs leaves room for fifty connections to trickle in on a busy machine.
    endpoint = Endpoint(metrics, lambda: None, max_connections=64, timeout=10,
                        reuse_secs=2.0)
    bodies: list[bytes] = []

    async def scrape(address: tuple[str, int]) -> None:
        peer = await Peer.connect(address)
        await peer.send(get("/metrics"))
        status, _, body = await peer.response()
        assert status == 200
        bodies.append(body)

    with trio.fail_after(10):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        address = listeners[0].socket.getsockname()[:2]
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_endpoint, endpoint, listeners)
            async with trio.open_nursery() as scrapers:
                for _ in range(50):
                    scrapers.start_soon(scrape, address)
            # Fifty at once: one rendering, the same bytes for all.
            assert counting.renderings == 1
            assert len(bodies) == 50 and len(set(bodies)) == 1
            assert b"\ntest_renderings 1.0\n" in bodies[0]
            # Within reuse_secs of its start a rendering answers again; later, a new one.
            await scrape(address)
            assert counting.renderings == 1
            await trio.sleep(2.0)
            await scrape(address)
            assert counting.renderings == 2 and b"\ntest_renderings 2.0\n" in bodies[-1]
            nursery.cancel_scope.cancel()


async def test_two_hundred_scrapers_at_once_neither_stall_health_nor_render_each() -> None:
    metrics = big_registry(1000)
    counting = CountingCollector(delay=0.05)
    metrics.add_collector(counting)
    answered: list[int] = []
    refused: list[int] = []

    async def scrape(address: tuple[str, int], i: int) -> None:
        peer = await Peer.connect(address)
        try:
            await peer.send(get("/metrics"))
            status, _, body = await peer.response()
            assert status == 200 and len(body) > 200_000
            answered.append(i)
        except (EOFError, trio.BrokenResourceError):
            refused.append(i)  # over the limit: closed at once, nothing answered

    async def health(address: tuple[str, int]) -> int:
        """Attempts until /health answers (a refused connection is closed at once)."""
        attempts = 0
        while True:
            attempts += 1
            peer = await Peer.connect(address)
            try:
                await peer.send(get("/health"))
                assert (await peer.response())[::2] == (200, b"ready\n")
                return attempts
            except (EOFError, trio.BrokenResourceError):
                await trio.sleep(0.01)

    # The timeout is long: a connection left waiting for it would overrun fail_after.
    with trio.fail_after(20):
        async with served(metrics, http_timeout_secs=60) as (address, _):
            began = trio.current_time()
            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(scrape, address, i)
                assert await health(address) >= 1
            took = trio.current_time() - began
    assert len(answered) + len(refused) == 200
    assert answered
    # Those refused were counted; the answered ones shared a rendering a second at most.
    assert (metrics.registry.get_sample_value(
        "figtank_limit_hits_total", {"limit": "http_max_connections"}) or 0) >= len(refused)
    assert counting.renderings <= 1 + took / REUSE_SECS < len(answered)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_scrapers_that_never_read_are_closed_and_hold_no_copy_each() -> None:
    metrics = big_registry(2000)  # an answer of about 500 KB
    count = 100
    clients: list[trio.SocketStream] = []
    baseline_fds = _fds()
    tracemalloc.start()
    try:
        with trio.fail_after(30):
            # The timeout leaves room for 100 connects on a busy machine (the suite runs
            # two test files at once) before the check that every one is still open.
            async with served(metrics, http_max_connections=count + 10,
                              http_timeout_secs=4) as (address, _):
                before = tracemalloc.get_traced_memory()[0]
                for _ in range(count):
                    sock = trio.socket.socket()
                    # A small window: the server's send stays blocked on the answer.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    await sock.connect(address)
                    stream = trio.SocketStream(sock)
                    await stream.send_all(get("/metrics"))
                    clients.append(stream)
                await trio.sleep(0.5)  # every answer is being sent
                held = tracemalloc.get_traced_memory()[0] - before
                assert _fds() >= baseline_fds + 2 * count
                # One rendering for all, sent from the same bytes: not 500 KB a connection.
                assert held < 10_000_000, held
                # After the timeout the server has closed its side of each connection.
                deadline = trio.current_time() + 8
                while _fds() > baseline_fds + count + 5:
                    assert trio.current_time() < deadline, _fds()
                    await trio.sleep(0.1)
                assert tracemalloc.get_traced_memory()[0] - before < 2_000_000
                for stream in clients:  # what is left to read, then the end
                    with trio.fail_after(5):
                        while await _receive(stream):
                            pass
    finally:
        tracemalloc.stop()
        for stream in clients:
            await trio.aclose_forcefully(stream)


async def _receive(stream: trio.SocketStream) -> bytes:
    try:
        return await stream.receive_some(1 << 20)
    except trio.BrokenResourceError:
        return b""


async def test_a_failing_rendering_answers_500_to_its_scrapes_and_the_next_renders_anew(
        ) -> None:
    metrics = Metrics()
    failing = [True]

    def samples() -> list[tuple[list[str], float]]:
        time.sleep(0.2)  # the scrapes below arrive while it runs
        if failing[0]:
            raise RuntimeError("a collector's bug")
        return [([], 2.0)]

    metrics.add_collector(GaugeCollector("test_flaky", "Fails first.", [], samples))
    endpoint = Endpoint(metrics, lambda: None, max_connections=8, timeout=10, reuse_secs=0)
    statuses: list[int] = []

    async def scrape(address: tuple[str, int]) -> bytes:
        peer = await Peer.connect(address)
        await peer.send(get("/metrics"))
        status, _, body = await peer.response()
        statuses.append(status)
        return body

    with trio.fail_after(10), capture_logs() as logs:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        address = listeners[0].socket.getsockname()[:2]
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_endpoint, endpoint, listeners)
            async with trio.open_nursery() as scrapers:
                for _ in range(3):
                    scrapers.start_soon(scrape, address)
            assert statuses == [500, 500, 500]
            failing[0] = False
            assert b"\ntest_flaky 2.0\n" in await scrape(address)
            nursery.cancel_scope.cancel()
    failures = [e for e in logs if e["event"] == "metrics_render_failed"]
    assert [e["error"] for e in failures] == ["RuntimeError: a collector's bug"]
