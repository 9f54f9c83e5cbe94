"""A partition's history, written straight to the upstream by librdkafka in large record
batches (thousands of records each, over a megabyte), read through a gateway from the
first offset by a Tank consumer and a Figg subscriber: every record once, in order. Past
the tail the gateway reads the upstream with Fetch requests of its own, so this is where
an upstream's Fetch answers (their sizes, their waits) matter."""

from __future__ import annotations

import confluent_kafka as ck
import trio

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.serving import ServeProcess
from tests.upstream_kafka.helpers import AnyUpstream, blocking, gateway

MESSAGES = 20_000
SIZE = 128
#: Seconds each reader may take to read them all.
PHASE_SECS = 40


def value(i: int) -> bytes:
    return (b"h-%05d-" % i).ljust(SIZE, b".")


def produce_direct(address: str, topic: str) -> None:
    """:data:`MESSAGES` records to ``topic``/0 in batches as large as librdkafka makes."""
    producer = ck.Producer({"bootstrap.servers": address, "enable.idempotence": True,
                            "linger.ms": 50, "batch.size": 2_000_000})
    for i in range(MESSAGES):
        while True:
            try:
                producer.produce(topic, value(i), partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(30) == 0


def _warnings(served: ServeProcess) -> list[dict]:
    """The gateway's log lines above info (what it said about the reads)."""
    return [line for line in served.log_lines if line.get("level") not in ("info", "debug")]


async def test_history_in_large_batches_is_read_through_the_gateway(
        upstream: AnyUpstream) -> None:
    front = gateway(upstream.address)
    try:
        with trio.fail_after(60 + 2 * PHASE_SECS):
            await upstream.start()
            await upstream.create_topic("history", 1)
            await blocking(produce_direct, upstream.address, "history")
            served = await front.start()
            assert served.tank and served.figg
            seqs: list[int] = []
            wrong: list[int] = []
            async with open_tank_client(*served.tank, request_timeout=15) as tank:
                seq = 1
                with trio.move_on_after(PHASE_SECS):
                    while seq <= MESSAGES:
                        result = await tank.consume("history", 0, seq, max_wait_ms=500,
                                                    min_bytes=1, fetch_size=1 << 20)
                        for m in result.messages:
                            if m.seq >= seq:
                                seqs.append(m.seq)
                                if m.value != value(m.seq - 1):
                                    wrong.append(m.seq)
                        if result.messages:
                            seq = result.next_seq
            assert seq > MESSAGES, (f"the Tank reader got no further than sequence {seq}",
                                    _warnings(served))
            assert seqs == list(range(1, MESSAGES + 1)) and not wrong
            offsets: list[int] = []
            async with open_figg_client(*served.figg) as figg:
                sub = await figg.subscribe("history", from_offset=0)
                with trio.move_on_after(PHASE_SECS):
                    while len(offsets) < MESSAGES:
                        message = await sub.receive()
                        offsets.append(message.offset)
                        if message.data != value(message.offset - 1):
                            wrong.append(message.offset)
            assert len(offsets) == MESSAGES, (f"the Figg subscriber got {len(offsets)}",
                                              _warnings(served))
            assert offsets == list(range(1, MESSAGES + 1)) and not wrong
    finally:
        front.close()
        upstream.close()
