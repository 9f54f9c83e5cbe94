"""Bad input on live connections: each closes only its own connection, with a log line
naming the peer and the reason; another client is served throughout."""

from __future__ import annotations

import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from structlog.testing import LogCapture

from gateway.client.tank import open_tank_client
from gateway.tank.listener import TankListener
from tests.tank.helpers import RunningServer, read_until_closed, tank_server

PING = b"\x03\x00\x00\x00\x00"
MAX_FRAME = 64 * 1024
IDLE_SECS = 1.0  # a loaded machine can stall a process for a few tenths


def frame(msg_id: int, payload: bytes) -> bytes:
    return struct.pack("<BI", msg_id, len(payload)) + payload


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The listener's ``connection_closed`` log events."""
    capture = LogCapture()
    logger = structlog.wrap_logger(structlog.PrintLogger(), processors=[capture])
    monkeypatch.setattr(TankListener, "log", logger)
    return capture.entries


@pytest.fixture
async def server(tmp_path: Path, closes: list[dict[str, Any]]
                 ) -> AsyncIterator[RunningServer]:
    async with tank_server(tmp_path / "data", max_frame_bytes=MAX_FRAME,
                           idle_timeout_secs=IDLE_SECS) as running:
        yield running


class SteadyClient:
    """Produces and consumes in a loop; every round must succeed."""

    def __init__(self) -> None:
        self.rounds = 0

    async def run(self, server: RunningServer, *, task_status: Any) -> None:
        async with open_tank_client(server.host, server.port, request_timeout=5) as client:
            task_status.started()
            while True:
                self.rounds += 1
                await client.produce({("steady", 0): [b"round %d" % self.rounds]})
                result = await client.consume("steady", 0, self.rounds)
                assert [m.value for m in result.messages] == [b"round %d" % self.rounds]
                await trio.sleep(0.005)


async def bad_connection(server: RunningServer, data: bytes, *, eof: bool = False,
                         limit: float = 5.0) -> bytes:
    """Send ``data`` and return what the server sent before closing the connection."""
    stream = await trio.open_tcp_stream(server.host, server.port)
    try:
        try:
            await stream.send_all(data)
            if eof:
                await stream.send_eof()
        except trio.BrokenResourceError:
            pass  # closed while we were still sending: fine
        return await read_until_closed(stream, limit)
    finally:
        await stream.aclose()


async def served_throughout(server: RunningServer, attack: Any) -> None:
    """Run ``attack`` while a steady client keeps working (its failures fail the test)."""
    steady = SteadyClient()

    async def rounds_done(n: int) -> None:
        while steady.rounds < n:
            await trio.sleep(0.005)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(steady.run, server)
            await rounds_done(3)
            await attack()
            await rounds_done(steady.rounds + 3)
            nursery.cancel_scope.cancel()


def kinds(closes: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in closes if e["event"] == "connection_closed"]


async def test_oversized_length_closes_before_the_payload(server: RunningServer,
                                                          closes: list[dict[str, Any]]
                                                          ) -> None:
    async def attack() -> None:
        header = struct.pack("<BI", 0x01, MAX_FRAME + 1)
        assert await bad_connection(server, header) == PING
        # A 4 GiB announcement is refused just the same, with nothing sent after it.
        assert await bad_connection(server, struct.pack("<BI", 0x02, 0xFFFFFFFF)) == PING

    await served_throughout(server, attack)
    bad = [e for e in closes if e.get("kind") == "frame_too_large"]
    assert len(bad) == 2
    assert bad[0]["peer"].startswith("127.0.0.1:") and bad[0]["protocol"] == "tank"
    assert "exceeds the maximum" in bad[0]["reason"]
    assert bad[0]["log_level"] == "warning"


async def test_unknown_msg_ids_and_refused_requests(server: RunningServer,
                                                    closes: list[dict[str, Any]]) -> None:
    async def attack() -> None:
        for msg_id in (0x00, 0x0D, 0x7F, 0xFF):
            assert await bad_connection(server, frame(msg_id, b"")) == PING
        assert await bad_connection(server, frame(0x04, struct.pack("<H", 1))) == PING
        consume_peer = struct.pack("<HQIH", 1, 0, 0, 1) + b"\x01t" + struct.pack(
            "<HHQI", 1, 0, 1, 100)
        assert await bad_connection(server, frame(0x09, consume_peer)) == PING
        no_topics = struct.pack("<HI", 2, 1) + b"\x00" + struct.pack("<QIB", 0, 0, 0)
        assert await bad_connection(server, frame(0x02, no_topics)) == PING

    await served_throughout(server, attack)
    assert kinds(closes).count("protocol_error") == 4
    refused = [e["reason"] for e in closes if e.get("kind") == "refused"]
    assert len(refused) == 3
    assert any("RegReplica" in r for r in refused)
    assert any("ConsumePeer" in r for r in refused)
    assert any("without topics" in r for r in refused)
    assert any("msgId 0x0d" in e["reason"] for e in closes if e.get("kind") == "protocol_error")


async def test_malformed_payloads(server: RunningServer, closes: list[dict[str, Any]]) -> None:
    cases = [
        frame(0x01, b"\x02\x00"),                                  # produce cut short
        frame(0x01, struct.pack("<HI", 2, 1) + b"\x09abc"),        # client id past the end
        frame(0x02, struct.pack("<HI", 2, 1) + b"\x00" + struct.pack("<QIB", 0, 0, 1)
              + b"\x05to"),                                        # topic name past the end
        frame(0x06, b"\x01\x00"),                                  # discover partitions
        frame(0x0A, b""),                                          # status without reqId
        frame(0x03, b"junk"),                                      # ping with a payload
        frame(0x07, struct.pack("<I", 1) + b"\x01t" + struct.pack("<H", 1) + b"\x80"),
    ]

    async def attack() -> None:
        for data in cases:
            assert await bad_connection(server, data) == PING

    await served_throughout(server, attack)
    assert kinds(closes).count("protocol_error") == len(cases)


async def test_truncated_frames(server: RunningServer, closes: list[dict[str, Any]]) -> None:
    whole = frame(0x0A, struct.pack("<I", 1))

    async def attack() -> None:
        # cut inside the header and inside the payload, then EOF: closed at once
        for cut in (1, 3, 6, len(whole) - 1):
            assert await bad_connection(server, whole[:cut], eof=True) == PING
        # cut and left hanging: no request ever completes, closed as idle
        start = trio.current_time()
        assert await bad_connection(server, whole[:6]) == PING
        assert trio.current_time() - start >= IDLE_SECS

    await served_throughout(server, attack)
    assert kinds(closes).count("protocol_error") == 4
    assert kinds(closes).count("idle") == 1


async def test_random_garbage(server: RunningServer, closes: list[dict[str, Any]]) -> None:
    rng = random.Random(4)

    async def attack() -> None:
        for _ in range(40):
            garbage = rng.randbytes(rng.randrange(1, 600))
            received = await bad_connection(server, garbage, eof=True)
            assert received.startswith(PING)

    await served_throughout(server, attack)
    assert len(kinds(closes)) >= 40


async def test_idle_connection_is_closed(server: RunningServer,
                                         closes: list[dict[str, Any]]) -> None:
    async def attack() -> None:
        start = trio.current_time()
        assert await bad_connection(server, b"") == PING
        assert trio.current_time() - start >= IDLE_SECS

    await served_throughout(server, attack)
    [idle] = [e for e in closes if e.get("kind") == "idle"]
    assert idle["log_level"] == "info" and "no request" in idle["reason"]


async def test_waiting_consume_is_not_idle(server: RunningServer) -> None:
    async with open_tank_client(server.host, server.port) as client:
        await client.create_topic("wait", 1)
        with trio.fail_after(5):
            # maxWait is longer than the idle timeout: the connection must stay up.
            result = await client.consume("wait", 0, 1, max_wait_ms=int(IDLE_SECS * 2500))
        assert result.messages == []
        assert (await client.status()).topics == 1
