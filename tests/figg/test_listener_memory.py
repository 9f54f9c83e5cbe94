"""The listener's own logic over the in-memory backend (a unit-test aid)."""

from __future__ import annotations

import socket

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
            assert Pong(77) in got  # PONG may overtake queued frames
            got.remove(Pong(77))
            assert got[0] == Attached("t", 0)
            assert [d for d in got if isinstance(d, Data)] == [
                Data("t", i, b"m%d" % i) for i in range(1, 6)]
            await peer.send(detach("t"))
            assert await peer.receive_one() == Detached("t")
            await peer.aclose()


async def test_second_attach_keeps_one_subscription():
    backend = MemoryBackend()
    with trio.fail_after(10):
        async with figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            await peer.send(*(publish("t", i, b"m%d" % i) for i in range(1, 4)))
            await peer.receive(3)
            await peer.send(attach("t", 0))
            got = await peer.receive(4)
            assert got[0] == Attached("t", 0)
            await peer.send(attach("t", 0))
            assert await peer.receive_one() == Attached("t", 3)  # where it stands
            await peer.send(publish("t", 4, b"m4"))
            got = await peer.receive(2)
            assert sorted(got, key=lambda e: type(e).__name__) == [Ack(4), Data("t", 4, b"m4")]
            await peer.send(ping(1))
            assert await peer.receive_one() == Pong(1)  # no second copy of m4 came first


async def test_detach_stops_delivery_at_once():
    backend = MemoryBackend()
    with trio.fail_after(10):
        async with figg_server(backend, subscriber_buffer_bytes=4096) as server:
            peer = await RawPeer.connect(server)
            payload = b"x" * 1000
            await peer.send(*(publish("t", i, payload) for i in range(1, 2001)))
            await peer.receive(2000)
            await peer.send(attach("t", 0))
            assert await peer.receive_one() == Attached("t", 0)
            await peer.send(detach("t"))
            seen = []
            while True:
                event = await peer.receive_one()
                if isinstance(event, Detached):
                    break
                seen.append(event.offset)
            assert seen == list(range(1, len(seen) + 1)) and len(seen) < 2000
            await peer.send(ping(5))
            assert await peer.receive_one() == Pong(5)  # and no DATA after DETACHED


async def test_detach_unknown_topic_is_answered():
    with trio.fail_after(5):
        async with figg_server(MemoryBackend()) as server:
            peer = await RawPeer.connect(server)
            await peer.send(detach("never"))
            assert await peer.receive_one() == Detached("never")


async def test_acks_follow_publish_order_across_partitions():
    backend = MemoryBackend(default_partitions=3)
    with trio.fail_after(10):
        async with figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            topics = ["p", "p/1", "p/2"]
            await peer.send(*(publish(topics[i % 3], i, b"v") for i in range(1, 31)))
            assert [a.seq_num for a in await peer.receive(30)] == list(range(1, 31))
            assert [p.hwm for p in backend.topics["p"]] == [10, 10, 10]


async def test_invalid_topic_closes_only_that_connection():
    with trio.fail_after(5):
        async with figg_server(MemoryBackend()) as server:
            good = await RawPeer.connect(server)
            bad = await RawPeer.connect(server)
            await bad.send(publish("../etc", 1, b"x"))
            await bad.expect_closed()
            await good.send(publish("ok", 1, b"x"))
            assert await good.receive_one() == Ack(1)
            closed = server.metrics.connections_closed.labels("figg", "figg", "invalid_topic")
            assert closed._value.get() == 1


async def test_failed_publish_closes_without_ack():
    backend = MemoryBackend()
    with trio.fail_after(5):
        async with figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            await peer.send(publish("a", 1, b"x"), publish("a/7", 2, b"y"),
                            publish("a", 3, b"z"))
            events = []
            try:
                while True:
                    events.append(await peer.receive_one())
            except (EOFError, trio.BrokenResourceError):
                pass
            assert events in ([], [Ack(1)])  # never 2, never 3 after a failed 2


async def test_attach_unknown_topic_without_auto_create_closes():
    backend = MemoryBackend(auto_create_topics=False)
    with trio.fail_after(5):
        async with figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            await peer.send(attach("nope", 0))
            await peer.expect_closed()
            assert "nope" not in backend.topics


async def test_attach_creates_topic_and_waits_for_live_data():
    backend = MemoryBackend()
    with trio.fail_after(5):
        async with figg_server(backend) as server:
            sub = await RawPeer.connect(server)
            await sub.send(attach("fresh"))
            assert await sub.receive_one() == Attached("fresh", 0)
            pub = await RawPeer.connect(server)
            await pub.send(publish("fresh", 1, b"live"))
            assert await sub.receive_one() == Data("fresh", 1, b"live")


async def test_subscription_skips_to_first_available_after_retention():
    backend = MemoryBackend()
    with trio.fail_after(5):
        async with figg_server(backend) as server:
            pub = await RawPeer.connect(server)
            for i in range(1, 11):
                await pub.send(publish("r", i, b"%d" % i))
                await pub.receive_one()
            backend.fetch_gate = gate = trio.Event()
            sub = await RawPeer.connect(server)
            await sub.send(attach("r", 0))
            assert await sub.receive_one() == Attached("r", 0)
            backend.trim("r", 0, 8)  # messages 1..8 expire before the subscription reads
            gate.set()
            assert [(await sub.receive_one()).offset for _ in range(2)] == [9, 10]


async def test_subscription_grows_its_fetch_for_cut_chunks():
    backend = MemoryBackend()
    backend.cut_chunks = True
    big = [bytes([i]) * (300 * 1024 + i) for i in range(3)]  # each over the fetch size
    with trio.fail_after(10):
        async with figg_server(backend) as server:
            peer = await RawPeer.connect(server)
            await peer.send(*(publish("cut", i, v) for i, v in enumerate(big)))
            await peer.receive(3)
            await peer.send(attach("cut", 0))
            assert await peer.receive_one() == Attached("cut", 0)
            got = await peer.receive(3)
            assert [(d.offset, d.data) for d in got] == [(i + 1, v) for i, v in enumerate(big)]


async def test_pong_and_ack_overtake_a_data_backlog():
    """A client far behind on DATA still gets PONG and ACK without waiting for the
    backlog queued for it (16 MiB here; only what the sockets already hold comes first)."""
    backend = MemoryBackend()
    with trio.fail_after(10):
        async with figg_server(backend, subscriber_buffer_bytes=16 << 20) as server:
            pub = await RawPeer.connect(server)
            await pub.send(*(publish("bl", i, b"x" * 4000) for i in range(1, 6001)))
            await pub.receive(6000)
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
            await sock.connect((server.host, server.port))
            peer = RawPeer(trio.SocketStream(sock))
            await peer.send(attach("bl", 0))
            await trio.sleep(0.3)  # the outbox fills up: we do not read
            await peer.send(ping(5), publish("bl", 1, b"mine"))
            seen = []
            last_offset = 0
            while len(seen) < 2:
                event = await peer.receive_one()
                if isinstance(event, (Pong, Ack)):
                    seen.append(event)
                elif isinstance(event, Data):
                    last_offset = event.offset
            assert last_offset < 3000  # far from the ~4000 messages (16 MiB) queued
