"""The listener's own logic over the in-memory backend (a unit-test aid)."""

from __future__ import annotations

import trio

from protocols.figg.messages import Ack, Attached, Data, Detached, Pong
from tests.figg.helpers import RawPeer, attach, detach, figg_server, ping, publish
from tests.figg.memory_backend import MemoryBackend


async def test_publish_ack_attach_data_ping():
    backend = MemoryBackend()
    with trio.fail_after(10):
        async with figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            await peer.send(*(publish("t", i, b"m%d" % i) for i in range(1, 6)))
            assert await peer.receive(5) == [Ack(i) for i in range(1, 6)]
            await peer.send(attach("t", 0), ping(77))
            got = await peer.receive(7)
            assert got[0] == Attached("t", 0)
            assert Pong(77) in got
            assert [d for d in got if isinstance(d, Data)] == [
                Data("t", i, b"m%d" % i) for i in range(1, 6)]
            await peer.send(detach("t"))
            assert await peer.receive_one() == Detached("t")
            await peer.aclose()
