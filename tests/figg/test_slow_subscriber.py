"""A subscriber that stops reading never makes the server buffer: its memory stays bounded.

The server runs as its own process (``figtank serve``) so its RSS can be read from
``/proc``. A publisher sends 200 MB while one subscriber has stopped reading; a second
subscriber reads everything as it comes. The stalled subscriber afterwards resumes where
it stopped, from the log.
"""

from __future__ import annotations

import socket

import pytest
import trio

from gateway.client.figg import open_figg_client
from protocols.figg.messages import Attached
from tests.figg.helpers import RawPeer, attach
from tests.serving import figtank_serve

TOTAL = 200 * 1000 * 1000
SIZE = 64 * 1024
COUNT = TOTAL // SIZE
#: Allowed RSS growth: far below the 200 MB a buffering server would need. It includes the
#: bounded caches a busy server fills (tail cache 16 MiB, DATA frame cache 8 MiB by default).
RSS_BOUND = 64 * 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def stalled_subscriber(port: int, topic: str) -> RawPeer:
    """Attach from the start over a socket with a small receive buffer, then stop reading."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    await sock.connect(("127.0.0.1", port))
    peer = RawPeer(trio.SocketStream(sock))
    await peer.send(attach(topic, 0))
    assert await peer.receive_one() == Attached(topic, 0)
    return peer


@pytest.mark.slow
async def test_slow_subscriber_keeps_server_memory_bounded(tmp_path):
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--durability", "os",
                       "--figg-listen", "127.0.0.1:0", "--tank-listen", "",
                       "--metrics-listen", "") as server:
        assert server.figg is not None
        with trio.fail_after(60):
            await run_scenario(server.process.pid, server.figg[1])
        assert server.stop() == 0


async def run_scenario(pid: int, port: int) -> None:
    payload = bytes(range(256)) * (SIZE // 256)
    options = {"ping_interval": 5.0}
    async with open_figg_client("127.0.0.1", port, **options) as publisher:
        await publisher.publish_and_wait("big", b"warm-up")
        stalled = await stalled_subscriber(port, "big")
        baseline = rss_bytes(pid)
        peak = baseline
        received = []

        async with open_figg_client("127.0.0.1", port, **options) as reader:
            sub = await reader.subscribe("big", from_offset=0, buffer=64)

            async def read_all() -> None:
                async for message in sub:
                    received.append(message.offset)
                    assert message.data in (payload, b"warm-up")
                    if len(received) == COUNT + 1:
                        return

            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, rss_bytes(pid))
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                async with trio.open_nursery() as work:
                    work.start_soon(read_all)
                    for _ in range(COUNT):
                        await publisher.publish("big", payload)
                    await publisher.wait_all_acked()
                nursery.cancel_scope.cancel()

    growth = peak - baseline
    print(f"server RSS: baseline {baseline / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB, "
          f"growth {growth / 2**20:.1f} MiB for {TOTAL / 1e6:.0f} MB published")
    assert received == list(range(1, COUNT + 2))  # the other subscriber kept up, in order
    assert growth < RSS_BOUND
    # The stalled subscriber lagged in the log, it lost nothing: it resumes at offset 1.
    got = await stalled.receive(40)
    assert [d.offset for d in got] == list(range(1, 41))
    await stalled.aclose()
