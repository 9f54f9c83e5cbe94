"""The gateway's own produce answers feed its subscribers (write-through): what the
subscribers get is still exactly the upstream's log, in order, when other producers write
to the same partition between the gateway's batches, and after the gateway stops
publishing. Against the figtank stand-in and Tansu."""

from __future__ import annotations

import struct
from pathlib import Path

import confluent_kafka as ck
import trio

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from protocols.figg.messages import ATTACH_FROM_OFFSET, MessageType
from protocols.figg.records import decode_data, encode_attach_frame
from tests.bridge.helpers import metric
from tests.upstream_kafka.helpers import AnyUpstream, blocking, upstream_and_gateway

TOPIC = "through"
WRITTEN_THROUGH = "figtank_upstream_feed_written_through_messages_total"
#: A Figg frame's header: type, version, payload size.
_FRAME_HEAD = struct.Struct(">HHI")


def _foreign_produce(address: str, values: list[bytes]) -> None:
    """Another producer, straight to the upstream: ``values`` to partition 0, in order."""
    producer = ck.Producer({"bootstrap.servers": address, "enable.idempotence": True,
                            "linger.ms": 0})
    errors: list[str] = []
    for value in values:
        producer.produce(TOPIC, value, partition=0,
                         on_delivery=lambda err, _: errors.append(str(err)) if err else None)
    assert producer.flush(20) == 0 and not errors, errors


async def test_subscribers_get_the_upstream_log_with_other_producers_between(
        tmp_path: Path, upstream: AnyUpstream) -> None:
    async with upstream_and_gateway(tmp_path, upstream=upstream) as (_, _, served):
        assert served.figg and served.metrics and served.tank
        with trio.fail_after(90):
            async with open_figg_client(*served.figg) as client:
                # The topic exists (created through the gateway) before the subscriber.
                await client.publish_and_wait(TOPIC, b"first")
                sub = await client.subscribe(TOPIC, from_offset=0)
                sent = 1
                # Rounds of gateway publishes (written through) with another producer's
                # messages between them (a gap the feed must fetch).
                for round_ in range(12):
                    for i in range(25):
                        await client.publish(TOPIC, b"gw-%02d-%02d" % (round_, i))
                    await client.wait_all_acked()
                    await blocking(_foreign_produce, upstream.address,
                                   [b"other-%02d-%d" % (round_, i) for i in range(3)])
                    sent += 28
                # Then the gateway stops: the feed reads the upstream again.
                await blocking(_foreign_produce, upstream.address, [b"after-quiet"])
                sent += 1
                got = [(m.offset, m.data) for m in [await sub.receive() for _ in range(sent)]]
            stored = await upstream.stored(TOPIC)
            assert len(stored) == sent
            assert got == stored  # every message once, at its upstream offset, in order
            # A Tank consumer through the gateway reads the same log from the feed.
            async with open_tank_client(*served.tank, request_timeout=10) as tank:
                seen: list[tuple[int, bytes]] = []
                seq = 1
                while seq <= sent:
                    result = await tank.consume(TOPIC, 0, seq, fetch_size=1 << 20)
                    seen += [(m.seq, m.value) for m in result.messages if m.seq >= seq]
                    seq = seen[-1][0] + 1
            assert seen == stored
        # Whether a batch is written through or fetched depends on which answer the
        # gateway reads first; both give the same log (above).
        written = metric(served.metrics, WRITTEN_THROUGH)
        assert written is not None and 0 <= written <= 12 * 25 + 1, written


async def test_a_quiet_feed_reads_the_upstream_again(tmp_path: Path) -> None:
    """After the gateway's own publishes stop, another producer's message reaches the
    gateway's subscriber within a fraction of a second (the feed fetches again)."""
    async with upstream_and_gateway(tmp_path) as (upstream, _, served):
        assert served.figg and served.metrics
        with trio.fail_after(60):
            async with open_figg_client(*served.figg) as client:
                await client.publish_and_wait(TOPIC, b"one")
                sub = await client.subscribe(TOPIC, from_offset=0)
                assert (await sub.receive()).data == b"one"
                # One at a time: each answer is a chance for the feed to be written
                # through (the upstream writes the Produce answer before it answers the
                # feed's Fetch; the gateway may read them in either order).
                for i in range(30):
                    await client.publish_and_wait(TOPIC, b"burst-%d" % i)
                    assert (await sub.receive()).data == b"burst-%d" % i
                written = metric(served.metrics, WRITTEN_THROUGH)
                assert written is not None and written > 0
                await blocking(_foreign_produce, upstream.address, [b"from-elsewhere"])
                started = trio.current_time()
                message = await sub.receive()
                assert (message.offset, message.data) == (32, b"from-elsewhere")
                assert trio.current_time() - started < 1.0


PUSHES = "figtank_upstream_feed_pushes_total"


async def _read_data(stream: trio.SocketStream, count: int) -> list[tuple[int, bytes]]:
    """``count`` DATA messages from a raw Figg connection: (offset, data) each."""
    got: list[tuple[int, bytes]] = []
    buffer = bytearray()
    while len(got) < count:
        data = await stream.receive_some(1 << 16)
        assert data, "the gateway closed the connection"
        buffer += data
        pos = 0
        while len(buffer) - pos >= 8:
            kind, _, size = _FRAME_HEAD.unpack_from(buffer, pos)
            if len(buffer) - pos - 8 < size:
                break
            if kind == MessageType.DATA:
                message = decode_data(bytes(buffer[pos + 8:pos + 8 + size]))
                got.append((message.offset, message.data))
            pos += 8 + size
        del buffer[:pos]
    return got


async def test_subscribers_at_the_tail_are_pushed_to_and_one_that_stops_reading_catches_up(
        tmp_path: Path) -> None:
    """A subscriber at the feed's tail gets each batch from the task that brought it
    (counted as pushes); one whose connection stops reading is left behind by the push,
    reads on its own once it reads again, and misses nothing."""
    async with upstream_and_gateway(tmp_path) as (upstream, _, served):
        assert served.figg and served.metrics
        with trio.fail_after(90):
            async with open_figg_client(*served.figg) as client, \
                    open_figg_client(*served.figg) as reading:
                await client.publish_and_wait(TOPIC, b"first")
                reader = await reading.subscribe(TOPIC, from_offset=0)
                stalled = await trio.open_tcp_stream(*served.figg)
                await stalled.send_all(encode_attach_frame(ATTACH_FROM_OFFSET,
                                                           TOPIC.encode(), 0))
                values = [b"%05d" % i + bytes(1000) for i in range(6000)]
                expected = list(enumerate([b"first", *values], start=1))
                got: list[tuple[int, bytes]] = []

                async def read() -> None:
                    for _ in expected:
                        message = await reader.receive()
                        got.append((message.offset, message.data))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    for start in range(0, len(values), 200):
                        for value in values[start:start + 200]:
                            await client.publish(TOPIC, value)
                        await client.wait_all_acked()
                assert got == expected
                pushes = metric(served.metrics, PUSHES)
                assert pushes is not None and pushes > 0
                # 6 MB the stalled connection never read: far past its outbox and its
                # socket's buffers, so the push left it behind; it catches up now.
                assert await _read_data(stalled, len(expected)) == expected
                await stalled.aclose()
            assert await upstream.stored(TOPIC) == expected
