"""What one connection may hold and how long it may dawdle, on both listeners (issue 15,
items 1 and 3): admission within one read against ``limits.response_buffer_bytes``,
``limits.max_requests_in_flight`` and ``limits.unacked_bytes``; subscriptions per Figg
connection; ``limits.frame_timeout_secs`` and ``limits.idle_timeout_secs`` on Figg as on
Tank. Each limit reached counts once per episode in ``figtank_limit_hits``."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway.backend.embedded import EmbeddedSettings, open_embedded_backend
from gateway.client.tank import open_tank_client
from gateway.core.config import Settings
from protocols.connection import NEED_DATA, Role
from protocols.figg.messages import Ack, Attached, Pong
from protocols.tank.bundle import Message, encode_bundle
from protocols.tank.connection import TankConnection
from protocols.tank.messages import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    Ping,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
)
from tests.figg.helpers import RawPeer, attach, ping, publish
from tests.listeners import RunningServer, listening

PING_FRAME = b"\x03\x00\x00\x00\x00"


@asynccontextmanager
async def server(protocol: str, tmp_path: Path, **settings: Any
                 ) -> AsyncIterator[RunningServer]:
    config = Settings(data_dir=tmp_path / "data", **{"durability": "os", **settings})
    async with listening(protocol, None, config) as running:  # type: ignore[arg-type]
        yield running


def hits(server: RunningServer, limit: str) -> float:
    return server.metric(f'figtank_limit_hits_total{{limit="{limit}"}}') or 0.0


def closed(server: RunningServer, reason: str) -> float:
    protocol = server.listener.protocol
    return server.metric(f'figtank_connections_closed_total{{listener="{protocol}",'
                         f'protocol="{protocol}",reason="{reason}"}}') or 0.0


def the_session(server: RunningServer) -> Any:
    [session] = server.listener._slots._sessions
    return session


async def small_window_stream(server: RunningServer) -> trio.SocketStream:
    """A connection whose receive buffer is small: what the client does not read stays
    with the server (instead of in the kernel's buffers)."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((server.host, server.port))
    return trio.SocketStream(sock)


async def read_tank(stream: trio.SocketStream, conn: TankConnection, n: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n:
        event = conn.next_event()
        if event is NEED_DATA:
            data = await stream.receive_some(1 << 20)
            assert data, f"closed after {len(out)} events"
            conn.receive_data(data)
        elif type(event) is not Ping:
            out.append(event)
    return out


def consume(request_id: int, topic: str, seq: int, *, max_wait_ms: int = 0) -> Any:
    return ConsumeRequest(2, request_id, "t", max_wait_ms, 0, 0,
                          [ConsumeTopic(topic, [ConsumePartition(0, seq, 1 << 20)])])


def produce(request_id: int, topic: str, value: bytes) -> Any:
    bundle = encode_bundle([Message(value)])
    return ProduceRequest(2, request_id, "t", 1, 0,
                          [ProduceTopic(topic, [ProducePartition(0, bundle)])])


# ------------------------------------------------------------------ Tank admission


async def test_tank_stops_reading_while_its_responses_pile_up(tmp_path: Path) -> None:
    budget = 64 * 1024
    value = os.urandom(32 * 1024)  # (not compressible)
    async with server("tank", tmp_path, response_buffer_bytes=budget) as running:
        async with open_tank_client(running.host, running.port) as client:
            await client.produce({("big", 0): [value]})
        with trio.fail_after(5):
            while running.listener.active:
                await trio.sleep(0.01)
        stream = await small_window_stream(running)
        conn = TankConnection(Role.CLIENT)
        # 400 Consumes of 32 KiB in one write (16 KB of requests: about one read).
        await stream.send_all(b"".join(conn.send(consume(i, "big", 1)) for i in range(400)))
        await trio.sleep(0.5)
        session = the_session(running)
        assert session._outbox.queued_bytes < budget + len(value) + 1024
        assert session.requests < 400
        assert hits(running, "response_buffer_bytes") == 1  # one episode, many waits
        with trio.fail_after(10):
            replies = await read_tank(stream, conn, 400)
        assert sorted(r.request.request_id for r in replies) == list(range(400))
        assert all(len(r.response.topics[0].partitions[0].chunk) > len(value)
                   for r in replies)
        await stream.aclose()


async def test_tank_pipelined_consumes_hold_few_descriptors(tmp_path: Path) -> None:
    # Item 1: Consumes answered from the files (no tail cache) that a client never reads
    # hold the chunks' descriptors only up to the response budget.
    value = os.urandom(32 * 1024)
    async with server("tank", tmp_path, response_buffer_bytes=64 * 1024,
                      tail_cache_bytes=0) as running:
        async with open_tank_client(running.host, running.port) as client:
            await client.produce({("files", 0): [value]})
        stream = await small_window_stream(running)
        conn = TankConnection(Role.CLIENT)
        before = len(os.listdir("/proc/self/fd"))
        await stream.send_all(b"".join(conn.send(consume(i, "files", 1)) for i in range(400)))
        await trio.sleep(0.5)
        assert len(os.listdir("/proc/self/fd")) - before < 20
        assert hits(running, "response_buffer_bytes") == 1
        with trio.fail_after(10):
            replies = await read_tank(stream, conn, 400)
        assert len(replies) == 400
        await stream.aclose()


async def test_tank_requests_in_flight_hold_the_connection_back(tmp_path: Path) -> None:
    async with server("tank", tmp_path, max_requests_in_flight=2) as running:
        async with open_tank_client(running.host, running.port) as client:
            await client.create_topic("wait", 1)
        with trio.fail_after(5):
            while running.listener.active:
                await trio.sleep(0.01)
        stream = await trio.open_tcp_stream(running.host, running.port)
        conn = TankConnection(Role.CLIENT)
        await stream.send_all(b"".join(
            conn.send(consume(i, "wait", 1, max_wait_ms=20_000)) for i in range(5)))
        await trio.sleep(0.3)
        assert the_session(running).requests == 2
        assert hits(running, "max_requests_in_flight") == 1
        async with open_tank_client(running.host, running.port) as client:
            await client.produce({("wait", 0): [b"go"]})
        with trio.fail_after(5):
            replies = await read_tank(stream, conn, 5)
        assert sorted(r.request.request_id for r in replies) == list(range(5))
        await stream.aclose()


async def test_tank_unacked_produce_bytes_hold_the_connection_back(tmp_path: Path) -> None:
    async with server("tank", tmp_path, durability="fsync", unacked_bytes=1) as running:
        stream = await trio.open_tcp_stream(running.host, running.port)
        conn = TankConnection(Role.CLIENT)
        await stream.send_all(b"".join(conn.send(produce(i, "p", b"v%d" % i))
                                       for i in range(20)))
        with trio.fail_after(10):
            replies = await read_tank(stream, conn, 20)
        assert [r.request.request_id for r in replies] == list(range(20))
        assert all(r.response.topics[0].partitions[0].error == 0 for r in replies)
        assert hits(running, "unacked_bytes") >= 1
        await stream.aclose()


# ------------------------------------------------------------------ Figg admission


async def test_figg_unacked_publish_bytes_hold_the_connection_back(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", durability="fsync", unacked_bytes=1,
                        figg_listen="", tank_listen="", metrics_listen="")
    async with open_embedded_backend(EmbeddedSettings.of(settings)) as backend, \
            listening("figg", backend, settings) as running:
        peer = await RawPeer.connect(running)
        await peer.send(*(publish("p", i, b"x") for i in range(1, 41)))
        with trio.fail_after(10):
            got = await peer.receive(40)
        assert got == [Ack(i) for i in range(1, 41)]
        assert hits(running, "unacked_bytes") >= 1
        await peer.aclose()


async def test_figg_subscriber_buffer_holds_the_connection_back(tmp_path: Path) -> None:
    async with server("figg", tmp_path, subscriber_buffer_bytes=16 * 1024) as running:
        writer = await RawPeer.connect(running)
        await writer.send(*(publish("s", i, bytes(8192)) for i in range(1, 201)))
        with trio.fail_after(10):
            await writer.receive(200)
        stream = await small_window_stream(running)
        await stream.send_all(attach("s", 0))
        await trio.sleep(0.3)
        await stream.send_all(ping(5))  # not read yet: the connection is held back
        await trio.sleep(0.3)
        assert hits(running, "subscriber_buffer_bytes") == 1
        reader = RawPeer(stream)
        with trio.fail_after(10):
            got = await reader.receive(202)
        assert Pong(5) in got and got[0] == Attached("s", 0)
        await reader.aclose()
        await writer.aclose()


async def test_figg_subscriptions_per_connection_are_bounded(tmp_path: Path) -> None:
    async with server("figg", tmp_path, max_requests_in_flight=3) as running:
        peer = await RawPeer.connect(running)
        await peer.send(attach("a"), attach("b"), attach("c"), attach("a"))
        with trio.fail_after(5):
            got = await peer.receive(4)  # one subscription per topic: "a" again is fine
        assert [type(e) for e in got] == [Attached] * 4
        await peer.send(attach("d"))
        with trio.fail_after(5):
            await peer.expect_closed()
        assert closed(running, "subscription_limit") == 1
        assert hits(running, "max_requests_in_flight") == 1


# -------------------------------------------------------------------------- timers


async def hang(running: RunningServer, data: bytes, limit: float) -> float:
    """Send ``data`` and wait for the server to close; returns how long that took."""
    stream = await trio.open_tcp_stream(running.host, running.port)
    start = trio.current_time()
    await stream.send_all(data)
    with trio.fail_after(limit):
        while True:
            try:
                if not await stream.receive_some(65536):
                    break
            except trio.BrokenResourceError:
                break
    await stream.aclose()
    return trio.current_time() - start


async def test_a_partial_frame_times_out_on_figg(tmp_path: Path) -> None:
    async with server("figg", tmp_path, frame_timeout_secs=0.3, idle_timeout_secs=30) as running:
        took = await hang(running, publish("t", 1, bytes(1000))[:500], 5)
        assert 0.3 <= took < 3
        assert closed(running, "frame_timeout") == 1


async def test_a_partial_frame_times_out_on_tank(tmp_path: Path) -> None:
    async with server("tank", tmp_path, frame_timeout_secs=0.3, idle_timeout_secs=30) as running:
        took = await hang(running, b"\x01" + struct.pack("<I", 1 << 20) + bytes(1000), 5)
        assert 0.3 <= took < 3
        assert closed(running, "frame_timeout") == 1


async def test_a_trickled_frame_times_out_although_bytes_keep_coming(tmp_path: Path) -> None:
    for protocol, head in (("figg", struct.pack(">HHI", 5, 1, 1000)),
                           ("tank", b"\x01" + struct.pack("<I", 1000))):
        async with server(protocol, tmp_path / protocol, frame_timeout_secs=0.4,
                          idle_timeout_secs=30) as running:
            stream = await trio.open_tcp_stream(running.host, running.port)
            await stream.send_all(head)
            start = trio.current_time()
            with trio.fail_after(5):
                try:
                    while True:
                        await stream.send_all(b"\x00")
                        await trio.sleep(0.05)
                except trio.BrokenResourceError:
                    pass
            assert trio.current_time() - start >= 0.4
            assert closed(running, "frame_timeout") == 1
            await stream.aclose()


async def test_frames_split_across_reads_do_not_time_out(tmp_path: Path) -> None:
    # Every read completes a frame and begins the next: no frame is ever late.
    for protocol, frame in (("figg", ping(1)), ("tank", PING_FRAME)):
        async with server(protocol, tmp_path / protocol, frame_timeout_secs=0.2,
                          idle_timeout_secs=30) as running:
            stream = await trio.open_tcp_stream(running.host, running.port)
            data = frame * 40
            step = len(frame) + 2
            for at in range(0, len(data), step):
                await stream.send_all(data[at:at + step])
                await trio.sleep(0.03)  # about 1 s in all
            await trio.sleep(0.1)
            assert closed(running, "frame_timeout") == 0
            assert running.listener.active == 1
            await stream.aclose()


async def test_a_silent_figg_connection_is_closed_as_idle(tmp_path: Path) -> None:
    async with server("figg", tmp_path, idle_timeout_secs=0.3) as running:
        took = await hang(running, b"", 5)
        assert 0.25 <= took < 3  # (the server may accept before the client's connect returns)
        assert closed(running, "idle") == 1


async def test_figg_connections_that_ping_or_subscribe_are_not_idle(tmp_path: Path) -> None:
    async with server("figg", tmp_path, idle_timeout_secs=0.3) as running:
        pinging = await RawPeer.connect(running)
        subscribed = await RawPeer.connect(running)
        await subscribed.send(attach("quiet"))
        assert await subscribed.receive_one() == Attached("quiet", 0)
        for i in range(8):  # 1.2 s: four timeouts
            await pinging.send(ping(i))
            assert await pinging.receive_one() == Pong(i)
            await trio.sleep(0.15)
        assert closed(running, "idle") == 0 and running.listener.active == 2
        await subscribed.send(ping(99))
        assert await subscribed.receive_one() == Pong(99)
        await pinging.aclose()
        await subscribed.aclose()
