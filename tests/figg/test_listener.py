"""The Figg listener on the embedded store: isolation between clients, restarts, limits."""

from __future__ import annotations

import hashlib
import os
import random
import socket
from pathlib import Path

import trio

from protocols.figg.messages import Ack, Attached, Data
from protocols.tank.bundle import iter_framed_bundles
from tests.figg.helpers import (
    RawPeer,
    RunningServer,
    attach,
    figg_server,
    open_test_backend,
    publish,
)
from tests.figg.proxy import _reset
from tests.store.helpers import hold_fsyncs


async def test_one_subscriber_leaving_never_affects_another(tmp_path):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            stay = await RawPeer.connect(server)
            leave = await RawPeer.connect(server)
            for peer in (stay, leave):
                await peer.send(attach("shared"))
                assert await peer.receive_one() == Attached("shared", 0)
            pub = await RawPeer.connect(server)
            await pub.send(*(publish("shared", i, b"a%d" % i) for i in range(1, 51)))
            await pub.receive(50)
            await _reset(leave.stream)  # gone mid-stream, without a goodbye
            await pub.send(*(publish("shared", i, b"b%d" % i) for i in range(51, 101)))
            await pub.receive(50)
            got = await stay.receive(100)
            assert [d.offset for d in got] == list(range(1, 101))


async def test_payloads_are_intact_under_concurrent_load(tmp_path):
    """Many publishers, varied sizes: every DATA payload is exactly what was published
    (the real Figg server corrupted live payloads by sharing its read buffer)."""
    def body(k: int, i: int) -> bytes:
        rnd = random.Random(k * 100_000 + i)
        head = b"%d:%d:" % (k, i)
        return head + hashlib.sha256(head).digest() * rnd.randrange(0, 200)

    with trio.fail_after(20):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            sub = await RawPeer.connect(server)
            await sub.send(attach("load"))
            await sub.receive_one()

            async def publisher(k: int) -> None:
                peer = await RawPeer.connect(server)
                for start in range(0, 200, 25):
                    await peer.send(*(publish("load", i, body(k, i))
                                      for i in range(start, start + 25)))
                assert [a.seq_num for a in await peer.receive(200)] == list(range(200))

            async with trio.open_nursery() as nursery:
                for k in range(8):
                    nursery.start_soon(publisher, k)
            got = await sub.receive(1600)
    assert [d.offset for d in got] == list(range(1, 1601))
    seen = set()
    for d in got:
        k, i, _ = d.data.split(b":", 2)
        assert d.data == body(int(k), int(i))
        seen.add((int(k), int(i)))
    assert len(seen) == 1600


async def test_restart_keeps_data_and_positions(tmp_path):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            pub = await RawPeer.connect(server)
            await pub.send(*(publish("keep", i, b"k%d" % i) for i in range(1, 21)))
            assert (await pub.receive(20))[-1] == Ack(20)
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            sub = await RawPeer.connect(server)
            await sub.send(attach("keep", 12))  # an offset handed out before the restart
            assert await sub.receive_one() == Attached("keep", 12)
            assert await sub.receive(8) == [Data("keep", i, b"k%d" % i) for i in range(13, 21)]
            await sub.send(attach("keep/0", 0))  # the same partition, by its other name
            assert await sub.receive_one() == Attached("keep/0", 0)
            assert (await sub.receive(20))[0] == Data("keep/0", 1, b"k1")


async def test_publish_and_replay_with_the_default_settings(tmp_path):
    """The listener as ``figtank serve`` runs it, with every default setting."""
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            await peer.send(*(publish("solo", i, b"s") for i in range(1, 101)),
                            attach("solo", 0))
            got = await peer.receive(201)
            assert [e for e in got if isinstance(e, Ack)] == [Ack(i) for i in range(1, 101)]
            assert len([e for e in got if isinstance(e, Data)]) == 100


async def test_connections_over_the_limit_are_closed(tmp_path):
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, \
                figg_server(backend, max_connections=2) as server:
            first = await RawPeer.connect(server)
            second = await RawPeer.connect(server)
            await first.send(publish("lim", 1, b"x"))
            await first.receive_one()
            await second.send(publish("lim", 1, b"x"))
            await second.receive_one()
            third = await RawPeer.connect(server)
            await third.expect_closed()
            await second.aclose()
            while server.metric('figtank_connections{listener="figg",protocol="figg"}') > 1:
                await trio.sleep(0.01)
            fourth = await RawPeer.connect(server)
            await fourth.send(publish("lim", 1, b"x"))
            assert await fourth.receive_one() == Ack(1)


def written_bundles(data: bytes) -> int:
    """Bundles in a segment file's bytes, up to the zeros written ahead of the appends."""
    count = pos = 0
    while pos < len(data) and data[pos]:
        _, length, _ = next(iter_framed_bundles(data, pos))
        pos += length
        count += 1
    return count


async def test_publishes_of_many_connections_share_an_fsync(tmp_path, monkeypatch):
    """Each read's publishes are written at once; one fsync covers every connection's."""
    gate, rounds = hold_fsyncs(monkeypatch)
    with trio.fail_after(10):
        async with open_test_backend(tmp_path) as backend, figg_server(backend) as server:
            peers = [await RawPeer.connect(server) for _ in range(5)]
            await peers[0].send(publish("g", 1, b"first"))
            while not rounds:  # the first round is under way, held at the gate
                await trio.sleep(0.005)
            for tag, peer in enumerate(peers[1:]):
                await peer.send(*(publish("g", i, b"%d" % tag) for i in range(10)))
            partition = backend.store.partition("g", 0)
            segment = next(e.path for e in os.scandir(partition.directory)
                           if e.name.endswith(".log"))
            while written_bundles(Path(segment).read_bytes()) < 5:
                await trio.sleep(0.005)  # every bundle written, none acknowledged yet
            assert partition.high_water_mark == 0
            gate.set()
            assert await peers[0].receive(1) == [Ack(1)]
            for peer in peers[1:]:
                assert await peer.receive(10) == [Ack(i) for i in range(10)]
            assert partition.high_water_mark == 41
            # Five bundles, three rounds: the held one, one started beside it (two run at
            # once) and one for the three bundles written while both were held.
            assert len(rounds) == 3


async def slow_reader(server: RunningServer) -> RawPeer:
    """A peer with a small receive buffer (it reads only when told to)."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    await sock.connect((server.host, server.port))
    return RawPeer(trio.SocketStream(sock))


async def test_subscribers_at_the_tail_share_one_feed_and_a_slow_one_drops_out(tmp_path):
    """Live subscribers follow one reader of the log; one whose client stops reading is
    released from the feed (the others go on), then catches up on its own, in order."""
    with trio.fail_after(20):
        async with open_test_backend(tmp_path) as backend, \
                figg_server(backend, subscriber_buffer_bytes=64 * 1024) as server:
            pub = await RawPeer.connect(server)
            await pub.send(publish("feed", 1, b"first"))
            await pub.receive(1)
            fast = [await RawPeer.connect(server) for _ in range(3)]
            slow = await slow_reader(server)
            for peer in [*fast, slow]:
                await peer.send(attach("feed", 1))
                assert await peer.receive_one() == Attached("feed", 1)
            await trio.testing.wait_all_tasks_blocked()
            feed = server.listener.feeds.get(b"feed")
            assert feed is not None and feed.followers == 4  # all four follow the reader
            payload = b"p" * 2000
            for start in range(2, 2002, 100):
                await pub.send(*(publish("feed", i, payload) for i in range(start, start + 100)))
                await pub.receive(100)
                for peer in fast:
                    got = await peer.receive(100)
                    assert [d.offset for d in got] == list(range(start, start + 100))
            # 4 MB published while the slow client read nothing: it left the feed
            assert server.listener.feeds.get(b"feed").followers == 3
            offsets = [d.offset for d in await slow.receive(2000)]
            assert offsets == list(range(2, 2002))  # all of it, in order, on its own
