"""Stopping a real ``figtank serve``: idle connections do not hold the shutdown, a second
signal cuts the grace period short, the exit status is 0 both ways and nothing
acknowledged is lost."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from protocols.connection import Role
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import ATTACH_FROM_OFFSET, Attach
from protocols.tank.connection import TankConnection
from protocols.tank.messages import ConsumePartition, ConsumeRequest, ConsumeTopic
from tests.serving import ServeProcess, figtank_serve
from tests.test_serve import publish, read_back, write_config

MIB = 1024 * 1024


def connect(address: tuple[str, int] | None, *, receive_buffer: int | None = None
            ) -> socket.socket:
    assert address is not None
    sock = socket.socket()
    if receive_buffer is not None:  # before connecting: it bounds the TCP window
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(5)
    sock.connect(address)
    return sock


def attach(address: tuple[str, int] | None, topic: str, *, from_start: bool = False,
           receive_buffer: int | None = None) -> socket.socket:
    """A raw Figg subscriber of ``topic`` (at its end, or from its first message)."""
    sock = connect(address, receive_buffer=receive_buffer)
    flags = ATTACH_FROM_OFFSET if from_start else 0
    sock.sendall(FiggConnection(Role.CLIENT).send(Attach(flags, topic, 0)))
    return sock


def wait_exit(server: ServeProcess, timeout: float) -> int:
    """The exit status once the server is gone (drained of its last log lines)."""
    server.process.wait(timeout=timeout)
    return server.stop()


def stopping_steps(server: ServeProcess) -> list[tuple[str, str | None]]:
    return [(e["step"], e.get("why")) for e in server.events("figtank_stopping")]


def test_idle_clients_close_at_once_and_exit_0(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with figtank_serve("--config", str(config), "--grace", "30") as server:
        subscriber = attach(server.figg, "quiet")
        assert subscriber.recv(4096)  # ATTACHED: subscribed at the end, nothing to send
        idle_tank = connect(server.tank)
        long_poll = connect(server.tank)
        long_poll.sendall(TankConnection(Role.CLIENT).send(ConsumeRequest(
            2, 1, "test", 30_000, 0, 0, [ConsumeTopic("quiet", [ConsumePartition(0, 1, 4096)])])))
        time.sleep(0.2)  # the Consume is parked: the topic has no message
        began = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        assert wait_exit(server, timeout=5) == 0
        assert time.monotonic() - began < 5  # the grace period was 30 s
        closes = server.events("connection_closed")
        assert sorted(e["protocol"] for e in closes) == ["figg", "tank", "tank"]
        assert {e["kind"] for e in closes} == {"shutdown"}
        assert [step for step, _ in stopping_steps(server)] == [
            "stop_accepting", "finish_in_flight", "close_backend"]
        for sock in (subscriber, idle_tank, long_poll):
            sock.close()


async def test_second_signal_cuts_the_grace_short(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    values = [bytes([i]) * MIB for i in range(16)]
    with figtank_serve("--config", str(config), "--grace", "30") as server:
        assert server.figg
        await publish(server.figg, "held", values)  # all acknowledged
        # A subscriber that reads nothing: the DATA queued for it (more than the socket
        # buffers take) is in flight, and holds the grace period.
        stuck = attach(server.figg, "held", from_start=True, receive_buffer=4096)
        time.sleep(0.5)
        server.process.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            server.process.wait(timeout=1)
        server.process.send_signal(signal.SIGINT)
        assert wait_exit(server, timeout=5) == 0
        stuck.close()
        assert [e["action"] for e in server.events("signal_received")] == [
            "shutdown", "cut_grace"]
        assert stopping_steps(server)[-2:] == [("cancel_connections", "grace cut short"),
                                               ("close_backend", None)]
        assert server.events("figtank_stopped")
    # Everything acknowledged is there after a restart.
    with figtank_serve("--config", str(config)) as server:
        assert server.figg
        assert await read_back(server.figg, "held", len(values)) == list(
            zip(range(1, len(values) + 1), values, strict=True))
        assert server.stop() == 0
