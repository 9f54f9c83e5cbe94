"""Two gateways over one upstream are interchangeable: a Figg subscriber reading through
gateway A, disconnected, resumes through gateway B at its last offset with no gap and no
duplicate while publishers keep publishing through both; Tank and Kafka clients see the
same offsets through either gateway."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import trio

from gateway.backend.kafka.wire import Security, open_broker
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from protocols.kafka.batch import Record, RecordBatch, encode_batch
from protocols.kafka.records import (
    InitProducerIdRequest,
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from protocols.kafka.types import ApiKey
from protocols.tank.bundle import Message
from tests.serving import ServeProcess
from tests.upstream_kafka.helpers import AnyUpstream, blocking, gateway, kafka_address

#: Messages each publisher sends (one through each gateway).
PER_PUBLISHER = 80
#: Messages the subscriber reads through gateway A before it moves to B.
BEFORE_MOVE = 40
#: Timestamp (ms) of the first message the Tank clients produce.
TIMESTAMP = 1_700_000_000_000


async def _publish(served: ServeProcess, tag: bytes, acked: list[bytes]) -> None:
    """Publish :data:`PER_PUBLISHER` messages in bursts of 10, each burst acknowledged."""
    assert served.figg
    async with open_figg_client(*served.figg) as figg:
        for burst in range(0, PER_PUBLISHER, 10):
            values = [b"%s-%03d" % (tag, i) for i in range(burst, burst + 10)]
            for value in values:
                await figg.publish("handover", value)
            await figg.wait_all_acked()
            acked += values
            await trio.sleep(0.01)


async def _read(served: ServeProcess, from_offset: int, count: int
                ) -> list[tuple[int, bytes]]:
    """ATTACH at ``from_offset`` (the last offset read) and read ``count`` messages."""
    assert served.figg
    async with open_figg_client(*served.figg) as figg:
        sub = await figg.subscribe("handover", from_offset=from_offset)
        return [(m.offset, m.data) for m in [await sub.receive() for _ in range(count)]]


def _kafka_read(address: str, topic: str, count: int) -> list[tuple[int, int, int, bytes]]:
    consumer = ck.Consumer({"bootstrap.servers": address, "group.id": "unused",
                            "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, p, 0) for p in (0, 1)])
        got: list[tuple[int, int, int, bytes]] = []
        for _ in range(100):
            got += [(m.partition(), m.offset(), m.timestamp()[1], m.value())
                    for m in consumer.consume(50, 0.2) if not m.error()]
            if len(got) >= count:
                break
        return sorted(got)
    finally:
        consumer.close()


async def test_a_subscriber_moves_between_gateways_without_gap_or_duplicate(
        upstream: AnyUpstream) -> None:
    front_a, front_b = gateway(upstream.address), gateway(upstream.address)
    total = 2 * PER_PUBLISHER
    try:
        with trio.fail_after(90):
            await upstream.start()
            a, b = await front_a.start(), await front_b.start()
            assert a.tank
            async with open_tank_client(*a.tank) as tank:
                await tank.create_topic("handover", 1)
            acked_a: list[bytes] = []
            acked_b: list[bytes] = []
            got: list[tuple[int, bytes]] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_publish, a, b"a", acked_a)
                nursery.start_soon(_publish, b, b"b", acked_b)
                got += await _read(a, 0, BEFORE_MOVE)
                # Disconnected from A; B continues from the last offset read.
                got += await _read(b, got[-1][0], total - BEFORE_MOVE)
            assert [offset for offset, _ in got] == list(range(1, total + 1))
            assert sorted(v for _, v in got) == sorted(acked_a + acked_b)
            # Each publisher's messages in its order; all of it as the upstream holds it.
            for tag in (b"a", b"b"):
                assert [v for _, v in got if v.startswith(tag)] == [
                    b"%s-%03d" % (tag, i) for i in range(PER_PUBLISHER)]
            assert got == await upstream.stored("handover")
    finally:
        front_a.close()
        front_b.close()
        upstream.close()


async def test_tank_and_kafka_clients_see_the_same_offsets_through_either_gateway(
        upstream: AnyUpstream) -> None:
    front_a, front_b = gateway(upstream.address), gateway(upstream.address)
    try:
        with trio.fail_after(90):
            await upstream.start()
            a, b = await front_a.start(), await front_b.start()
            assert a.tank and b.tank
            async with open_tank_client(*a.tank, request_timeout=10) as tank_a, \
                    open_tank_client(*b.tank, request_timeout=10) as tank_b:
                await tank_a.create_topic("shared", 2)
                for i in range(6):  # interleaved through both gateways
                    writer = tank_a if i % 2 else tank_b
                    await writer.produce({("shared", i % 2): [
                        Message(b"t%d-%d" % (i, j), None, TIMESTAMP + 10 * i + j)
                        for j in range(3)]})
                views: list[Any] = []
                for tank in (tank_a, tank_b):
                    bounds = [(x.first_available, x.high_water_mark)
                              for x in await tank.discover_partitions("shared")]
                    read = [[(m.seq, m.timestamp, m.value) for m in (await tank.consume(
                        "shared", p, 1, fetch_size=1 << 20)).messages] for p in (0, 1)]
                    views.append((bounds, read))
            assert views[0] == views[1]
            bounds, read = views[0]
            assert bounds == [(1, 9), (1, 9)]
            kafka = [await blocking(_kafka_read, kafka_address(served), "shared", 18)
                     for served in (a, b)]
            assert kafka[0] == kafka[1]
            # Kafka offset + 1 = Tank sequence, through either gateway.
            assert kafka[0] == sorted((p, seq - 1, ts, value) for p in (0, 1)
                                      for seq, ts, value in read[p])
            # The producers' timestamps, not the time the gateway sent them.
            assert sorted(ts for p in (0, 1) for _, ts, _ in read[p]) == [
                TIMESTAMP + 10 * i + j for i in range(6) for j in range(3)]
    finally:
        front_a.close()
        front_b.close()
        upstream.close()


async def _produce_raw(address: tuple[str, int], topic: str, batch: bytes) -> Any:
    """One Produce of ``batch`` (acks=all) to ``topic``/0 at a gateway's Kafka listener,
    with figtank's own client; the partition's answer."""
    async with trio.open_nursery() as nursery:
        connection = await open_broker(*address, nursery, security=Security(),
                                       client_id="retrier", timeout=10)
        answer = await connection.call(ApiKey.PRODUCE, ProduceRequest(None, -1, 10_000, [
            TopicProduceData(topic, [PartitionProduceData(0, batch)])]))
        connection.close("done")
        nursery.cancel_scope.cancel()
    return answer.responses[0].partition_responses[0]


async def _producer_id(address: tuple[str, int]) -> int:
    async with trio.open_nursery() as nursery:
        connection = await open_broker(*address, nursery, security=Security(),
                                       client_id="retrier", timeout=10)
        answer = await connection.call(ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest(
            transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1,
            producer_epoch=-1))
        connection.close("done")
        nursery.cancel_scope.cancel()
    assert answer.error_code == 0
    return int(answer.producer_id)


async def test_an_idempotent_retry_through_another_gateway_is_stored_once(
        upstream: AnyUpstream) -> None:
    """A Kafka client's producer id comes from the upstream (unique across gateways) and
    its batches go up under its own stamp: a batch sent through gateway A and sent again
    (as a client retries after a lost answer) through gateway B is stored once, and B
    answers with the offset A's got."""
    front_a, front_b = gateway(upstream.address), gateway(upstream.address)
    try:
        with trio.fail_after(60):
            await upstream.start()
            a, b = await front_a.start(), await front_b.start()
            assert a.kafka and b.kafka
            ids = {await _producer_id(a.kafka), await _producer_id(b.kafka),
                   await _producer_id(a.kafka)}
            assert len(ids) == 3  # the upstream numbered them all
            pid = min(ids)
            async with open_tank_client(*a.tank, request_timeout=10) as tank:  # type: ignore[misc]
                await tank.create_topic("retried", 1)
                await tank.produce({("retried", 0): [b"before"]})

            def batch(first_seq: int, values: list[bytes]) -> bytes:
                return encode_batch(RecordBatch(0, TIMESTAMP, TIMESTAMP, len(values) - 1, [
                    Record(i, 0, None, v) for i, v in enumerate(values)],
                    producer_id=pid, producer_epoch=0, base_sequence=first_seq))

            first = batch(0, [b"r0", b"r1"])
            answer_a = await _produce_raw(a.kafka, "retried", first)
            answer_b = await _produce_raw(b.kafka, "retried", first)
            assert (answer_a.error_code, answer_a.base_offset) == (0, 1)
            assert answer_b.error_code in (0, 46)  # NONE, DUPLICATE_SEQUENCE_NUMBER
            assert answer_b.base_offset in (1, -1)
            # The producer goes on through B; a gap in its sequence is refused upstream.
            answer = await _produce_raw(b.kafka, "retried", batch(2, [b"r2"]))
            assert (answer.error_code, answer.base_offset) == (0, 3)
            gap = await _produce_raw(b.kafka, "retried", batch(9, [b"r9"]))
            assert gap.error_code == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
            assert [v for _, v in await upstream.stored("retried")] == [
                b"before", b"r0", b"r1", b"r2"]
    finally:
        front_a.close()
        front_b.close()
        upstream.close()
