"""The gateway's own produce answers feed its subscribers (write-through): what the
subscribers get is still exactly the upstream's log, in order, when other producers write
to the same partition between the gateway's batches, and after the gateway stops
publishing. Against the figtank stand-in and Tansu."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka as ck
import trio

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.bridge.helpers import metric
from tests.upstream_kafka.helpers import AnyUpstream, blocking, upstream_and_gateway

TOPIC = "through"
WRITTEN_THROUGH = "figtank_upstream_feed_written_through_messages_total"


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
