"""A closed connection's memory is returned by reference counting alone (issue 15, item 2):
no reference cycle holds a session, its receive buffer or its protocol connection until
the cycle collector happens to run; and an idle connection costs the server little
resident memory (issue 27, item 4)."""

from __future__ import annotations

import gc
import socket
import struct
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.bench.command import bench
from gateway.bench.idle import PROTOCOLS
from gateway.client.tank import open_tank_client
from gateway.core.config import Settings
from gateway.figg.listener import FiggListener
from gateway.tank.listener import TankListener
from tests.figg.helpers import attach, detach, ping, publish
from tests.listeners import RunningServer, listening
from tests.serving import figtank_serve

MIB = 1024 * 1024


def tank_big_frame_head(size: int) -> bytes:
    return b"\x01" + struct.pack("<I", size)


def figg_big_frame_head(size: int) -> bytes:
    return struct.pack(">HHI", 5, 1, size)


# ----------------------------------------------------------------------- in process


@contextmanager
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@asynccontextmanager
async def watched(protocol: str, tmp_path: Path, sessions: list[weakref.ref[Any]],
                  monkeypatch: pytest.MonkeyPatch, **settings: Any
                  ) -> AsyncIterator[RunningServer]:
    """A listener whose sessions are also recorded in ``sessions`` as weak references."""
    listener = TankListener if protocol == "tank" else FiggListener
    make = listener.session

    def session(self: Any, stream: Any, log: Any, **options: Any) -> Any:
        made = make(self, stream, log, **options)
        sessions.append(weakref.ref(made))
        return made

    monkeypatch.setattr(listener, "session", session)
    config = Settings(data_dir=tmp_path / "data", **{"durability": "fsync", **settings})
    async with listening(protocol, None, config) as server:  # type: ignore[arg-type]
        yield server


async def raw_connection(server: RunningServer, data: bytes, *, eof: bool) -> None:
    stream = await trio.open_tcp_stream(server.host, server.port)
    try:
        await stream.send_all(data)
        if eof:
            await stream.send_eof()
            with trio.fail_after(5):
                while await stream.receive_some(65536):
                    pass
    except trio.BrokenResourceError:
        pass  # closed by the server first
    finally:
        await stream.aclose()


async def until_closed(server: RunningServer, count: int) -> None:
    with trio.fail_after(5):
        while server.listener.active or _closed(server) < count:
            await trio.sleep(0.01)
    await trio.sleep(0.05)  # the handler's last steps after its count


def _closed(server: RunningServer) -> float:
    samples = server.metrics.connections_closed.collect()[0].samples
    return sum(s.value for s in samples if s.name.endswith("_total"))


async def tank_client_work(server: RunningServer) -> None:
    async with open_tank_client(server.host, server.port) as client:
        await client.produce({("t", 0): [b"a", b"b"]})
        assert len((await client.consume("t", 0, 1)).messages) == 2
        with trio.move_on_after(0.1):  # a long poll cut short by the close
            await client.consume("t", 0, 3, max_wait_ms=5000)


SCENARIOS: dict[str, tuple[str, Callable[[RunningServer], Any]]] = {
    "tank_partial_frame_reset": ("tank", lambda s: raw_connection(
        s, tank_big_frame_head(MIB) + bytes(300_000), eof=False)),
    "tank_partial_frame_eof": ("tank", lambda s: raw_connection(
        s, tank_big_frame_head(MIB) + bytes(300_000), eof=True)),
    "tank_frame_too_large": ("tank", lambda s: raw_connection(
        s, tank_big_frame_head(4 * MIB) + bytes(1000), eof=True)),
    "tank_produce_consume_long_poll": ("tank", tank_client_work),
    "figg_partial_frame_eof": ("figg", lambda s: raw_connection(
        s, figg_big_frame_head(MIB) + bytes(300_000), eof=True)),
    "figg_frame_too_large": ("figg", lambda s: raw_connection(
        s, figg_big_frame_head(4 * MIB) + bytes(1000), eof=True)),
    "figg_subscribe_publish": ("figg", lambda s: raw_connection(
        s, attach("a", 0) + attach("b") + publish("a", 1, b"x") + publish("c", 1, b"y")
        + ping(3) + detach("b"), eof=True)),
    "figg_bad_partition": ("figg", lambda s: raw_connection(
        s, attach("a", 0) + publish("a", 1, b"x") + publish("c/9", 1, b"y"), eof=True)),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_a_closed_session_is_freed_without_the_cycle_collector(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    protocol, work = SCENARIOS[name]
    sessions: list[weakref.ref[Any]] = []
    async with watched(protocol, tmp_path, sessions, monkeypatch,
                       max_frame_bytes=2 * MIB) as server:
        with no_cycle_collector():
            await work(server)
            await until_closed(server, 1)
            assert len(sessions) == 1
            assert sessions[0]() is None, gc.get_referrers(sessions[0]())


# ---------------------------------------------------------------------- a process


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_rss_returns_to_baseline_after_abusive_connections(tmp_path: Path) -> None:
    """Connections that declare a 64 MiB frame, send 8 MB of it and close: 10 at a time,
    3 rounds, against ``figtank serve`` with ``gc`` as it is; its RSS returns near where
    it was (before the fix it kept every round's buffers: +240 MB)."""
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--durability", "os",
                       "--tank-listen", "127.0.0.1:0", "--figg-listen", "127.0.0.1:0",
                       "--metrics-listen", "", "--log-level", "info") as server:
        assert server.tank is not None and server.figg is not None
        time.sleep(0.3)
        baseline = rss_bytes(server.process.pid)
        chunk = bytes(8 * MIB)
        for round_ in range(1, 4):
            open_ = []
            for i in range(10):
                tank = i % 2 == 0
                sock = socket.create_connection(server.tank if tank else server.figg,
                                                timeout=10)
                head = (tank_big_frame_head if tank else figg_big_frame_head)(64 * MIB)
                sock.sendall(head + chunk)
                open_.append(sock)
            peak = rss_bytes(server.process.pid)
            for sock in open_:
                sock.close()
            deadline = time.monotonic() + 10
            while len(server.events("connection_closed")) < 10 * round_:
                assert time.monotonic() < deadline, "connections not closed"
                time.sleep(0.02)
        time.sleep(0.3)
        after = rss_bytes(server.process.pid)
        assert peak - baseline > 60 * MIB  # the buffers were really held while open
        assert after - baseline < 64 * MIB, (baseline // MIB, peak // MIB, after // MIB)
        assert server.stop() == 0


# ------------------------------------------------- resident memory per idle connection

#: Bytes of server RSS one idle connection may cost here. Issue 27 measured ~21 KB (Figg),
#: ~26 KB (Tank) and ~17 KB (Kafka) before, under 10 KB after; this ceiling leaves room
#: for the machine's noise but not for the old figures.
IDLE_CEILING = 14_000


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_idle_connection_costs_the_server_little_resident_memory(protocol: str) -> None:
    """``figtank bench idle-connections`` with 2,000 connections of one protocol against a
    ``figtank serve`` it starts: each connection does one exchange (a Figg PING, a Tank
    long poll at the tail, a Kafka ApiVersions) and stays open; every one is held (the
    exchange is answered on each) and the server's RSS grows by under the ceiling each."""
    report = bench(["idle-connections", "--connections", "2000", "--protocols", protocol,
                    "--ceiling", str(IDLE_CEILING)])
    [row], [check] = report.rows, report.checks
    assert check.expected == check.received == 2000, check.describe()
    per_connection = row.payload_bytes / row.messages
    assert per_connection > 0, row  # the connections were really open when measured
    assert report.ok, report.table()
    assert f"{protocol} idle connections" in report.table()
