"""Idempotent producers on the wire: InitProducerId, and Produce's sequence checks (a
retry answered with the original's offset, also while the original is in flight and on
another connection or listener; gaps, fenced epochs, a failed original, the bound on
producer states)."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from gateway.core.config import ListenerTable
from gateway.server.run import ServerInfo
from protocols.kafka import records as r
from protocols.kafka.batch import Record, RecordBatch, encode_batch, encode_records
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import kafka_server
from tests.kafka.raw import call, request
from tests.serving import Served

PRODUCE_VERSION = 9
INIT_VERSION = 4


def idempotent(pid: int, epoch: int, seq: int, count: int = 2, tag: bytes = b"") -> bytes:
    """A batch of ``count`` records of producer ``pid`` from sequence ``seq``."""
    recs = [Record(offset_delta=i, timestamp_delta=0, key=None, value=b"%s%d" % (tag, seq + i))
            for i in range(count)]
    batch = RecordBatch(base_offset=0, base_timestamp=1, max_timestamp=1,
                        last_offset_delta=count - 1, producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq)
    return encode_batch(batch, encode_records(recs), count)


def produce(records: bytes, topic: str = "t", partition: int = 0) -> r.ProduceRequest:
    return r.ProduceRequest(acks=-1, timeout_ms=5000, topic_data=[
        r.TopicProduceData(topic, [r.PartitionProduceData(partition, records)])])


async def send(stream: trio.SocketStream, records: bytes, *, partition: int = 0
               ) -> tuple[int, int, str | None]:
    """Produce and return the partition's (error code, base offset, error message)."""
    _, answer = await call(stream, ApiKey.PRODUCE, PRODUCE_VERSION,
                           produce(records, partition=partition))
    part = answer.responses[0].partition_responses[0]
    return part.error_code, part.base_offset, part.error_message


async def init_id(stream: trio.SocketStream, version: int = INIT_VERSION, **fields: object
                  ) -> r.InitProducerIdResponse:
    body = r.InitProducerIdRequest(**{"transactional_id": None,
                                      "transaction_timeout_ms": 60000, **fields})
    _, answer = await call(stream, ApiKey.INIT_PRODUCER_ID, version, body)
    return answer


async def high_water_mark(server: ServerInfo, topic: str = "t") -> int:
    infos = await server.backend.discover_partitions(topic)
    assert infos is not None
    return infos[0].high_water_mark


async def read_frames(stream: trio.SocketStream, count: int) -> list[bytes]:
    """``count`` response frames (without their length), however the reads cut them."""
    buf = b""
    frames: list[bytes] = []
    while len(frames) < count:
        while len(buf) >= 4 and len(buf) >= 4 + (size := int.from_bytes(buf[:4], "big")):
            frames.append(buf[4:4 + size])
            buf = buf[4 + size:]
        if len(frames) < count:
            data = await stream.receive_some(65536)
            assert data, "the connection closed"
            buf += data
    return frames


def limit_hits(server: ServerInfo, limit: str) -> float:
    return metric_value(server, f'figtank_limit_hits_total{{limit="{limit}"}}')


def metric_value(server: ServerInfo, sample: str) -> float:
    """The value of the metric sample (name and labels) ``sample``; 0 when absent."""
    start = sample + " "
    for line in server.metrics_registry.render().decode().splitlines():
        if line.startswith(start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_init_producer_id_in_every_version_and_transactions_refused(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            _, versions = await call(stream, ApiKey.API_VERSIONS, 3,
                                     r.ApiVersionsRequest("t", "1"))
            given = [await init_id(stream, v) for v in range(5)]
            again = await init_id(stream, 3, producer_id=given[0].producer_id,
                                  producer_epoch=0)
            half = await init_id(stream, 4, producer_id=given[0].producer_id)
            txn = await init_id(stream, 4, transactional_id="tx")
            empty = await init_id(stream, 1, transactional_id="")
    served = {v.api_key: (v.min_version, v.max_version) for v in versions.api_keys}
    assert served[ApiKey.INIT_PRODUCER_ID] == (0, 4)
    ids = [g.producer_id for g in given] + [again.producer_id]
    assert all(g.error_code == 0 and g.producer_epoch == 0 for g in [*given, again])
    assert len(set(ids)) == 6 and min(ids) > 0  # a new id each time, as Kafka does
    assert (half.error_code, half.producer_id) == (ErrorCode.INVALID_REQUEST, -1)
    assert empty.error_code == ErrorCode.INVALID_REQUEST
    assert (txn.error_code, txn.producer_id) == (
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)


async def test_a_retry_gets_the_original_offset_even_in_flight_and_elsewhere(tmp_path):
    """The original and its retry in one write: the retry is planned while the original
    waits for its fsync, waits for it and answers its offset; retries of any of the last
    five batches, on another connection or another Kafka listener, too."""
    async with kafka_server(tmp_path, durability="fsync", listeners={
            "kafka2": ListenerTable(protocol="kafka", address="127.0.0.1:0")}) as server:
        with trio.fail_after(10):
            one = await trio.open_tcp_stream(*server.kafka)
            pid = (await init_id(one)).producer_id
            assert (await send(one, idempotent(pid, 0, 0, 3)))[:2] == (0, 0)
            both = (request(ApiKey.PRODUCE, PRODUCE_VERSION, 2, produce(idempotent(pid, 0, 3)))
                    + request(ApiKey.PRODUCE, PRODUCE_VERSION, 3, produce(idempotent(pid, 0, 3))))
            await one.send_all(both)
            first, second = await read_frames(one, 2)
            other = await trio.open_tcp_stream(*server.kafka)
            elsewhere = await trio.open_tcp_stream(*server.addresses["kafka2"])
            old = await send(other, idempotent(pid, 0, 0, 3))
            older = await send(elsewhere, idempotent(pid, 0, 3))
            after = await send(elsewhere, idempotent(pid, 0, 5, 1))
            hwm = await high_water_mark(server)
    assert first[4:] == second[4:]  # the same answer (after the correlation id)
    assert old[:2] == (0, 0) and older[:2] == (0, 3)
    assert after[:2] == (0, 5)
    assert hwm == 6  # 3 + 2 + 1 records: each stored once


async def test_gaps_epochs_and_the_window(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            s = await trio.open_tcp_stream(*server.kafka)
            pid = (await init_id(s)).producer_id
            answers = {}
            for seq in range(0, 14, 2):  # seven batches of two
                answers[seq] = await send(s, idempotent(pid, 0, seq))
            gap = await send(s, idempotent(pid, 0, 20))
            dup_in_window = await send(s, idempotent(pid, 0, 4))
            dup_too_old = await send(s, idempotent(pid, 0, 2))  # six batches ago
            overlap = await send(s, idempotent(pid, 0, 12, 3))  # same start, longer
            new_epoch_late = await send(s, idempotent(pid, 1, 14))
            new_epoch = await send(s, idempotent(pid, 1, 0))
            fenced = await send(s, idempotent(pid, 0, 14))
            old_epoch_dup = await send(s, idempotent(pid, 0, 12))
            bad = await send(s, idempotent(pid, -1, 0))
            two = await send(s, idempotent(pid, 1, 2) + idempotent(pid, 1, 4))
            hwm = await high_water_mark(server)
    assert [a[:2] for a in answers.values()] == [(0, o) for o in range(0, 14, 2)]
    assert gap[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and "expected 14" in gap[2]
    assert dup_in_window[:2] == (0, 4)
    assert dup_too_old[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert overlap[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert new_epoch_late[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert new_epoch[:2] == (0, 14)
    assert fenced[0] == old_epoch_dup[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    assert bad[0] == ErrorCode.INVALID_RECORD
    assert two[0] == ErrorCode.INVALID_RECORD and "one batch" in two[2]
    assert hwm == 16


async def test_a_failed_original_fails_its_retry_then_is_forgotten(tmp_path):
    """Partition 3 does not exist: the append fails; the retry planned while it was in
    flight gets the same error; the producer is forgotten there, so its next batch is
    not refused as a duplicate or a gap (it fails again only for the missing partition),
    and partition 0 is unaffected."""
    async with kafka_server(tmp_path, durability="fsync") as server:
        with trio.fail_after(10):
            s = await trio.open_tcp_stream(*server.kafka)
            await server.backend.create_topic("t", 1)
            pid = (await init_id(s)).producer_id
            both = (request(ApiKey.PRODUCE, PRODUCE_VERSION, 1,
                            produce(idempotent(pid, 0, 0), partition=3))
                    + request(ApiKey.PRODUCE, PRODUCE_VERSION, 2,
                              produce(idempotent(pid, 0, 0), partition=3)))
            await s.send_all(both)
            first, second = await read_frames(s, 2)
            later = await send(s, idempotent(pid, 0, 7), partition=3)
            ok = await send(s, idempotent(pid, 0, 0), partition=0)
    assert first[4:] == second[4:]
    assert later[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert ok[:2] == (0, 0)
    assert len(server.listeners["kafka"].services.producers) == 1  # partition 0's only


async def test_producer_states_are_bounded(tmp_path):
    """With room for two states, a third producer makes the least recently used one
    forgotten (counted): its next batch is accepted at any sequence, as after a restart."""
    async with kafka_server(tmp_path, max_producer_states=2) as server:
        with trio.fail_after(10), capture_logs() as logs:
            s = await trio.open_tcp_stream(*server.kafka)
            pids = [(await init_id(s)).producer_id for _ in range(3)]
            for pid in pids[:2]:
                assert (await send(s, idempotent(pid, 0, 0, tag=b"%d" % pid)))[0] == 0
            assert (await send(s, idempotent(pids[1], 0, 9)))[0] == 45  # gap: known
            assert (await send(s, idempotent(pids[2], 0, 0)))[0] == 0  # pids[0] forgotten
            forgotten = await send(s, idempotent(pids[0], 0, 9))
            hits = limit_hits(server, "max_producer_states")
            held = len(server.listeners["kafka"].services.producers)
    assert forgotten[0] == 0  # not a gap any more
    assert hits == 2 and held == 2  # pids[0] then pids[1] went
    [line] = [e for e in logs if e["event"] == "producer_states_limit_reached"]  # once
    assert line["limit"] == "max_producer_states" and line["forgotten"] == 1


async def test_after_a_restart_ids_are_new_and_sequences_go_on(tmp_path):
    """The partition keeps producer state with its batches: after a restart a retry of a
    batch stored before it is answered with the original's offset (not stored again),
    the producer's sequences go on being checked, and ids are not handed out again."""
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            s = await trio.open_tcp_stream(*server.kafka)
            pid = (await init_id(s)).producer_id
            assert (await send(s, idempotent(pid, 0, 0)))[:2] == (0, 0)
            assert (await send(s, idempotent(pid, 0, 2)))[:2] == (0, 2)
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            s = await trio.open_tcp_stream(*server.kafka)
            later = (await init_id(s)).producer_id
            retried = await send(s, idempotent(pid, 0, 2))  # stored before the restart
            gap = await send(s, idempotent(pid, 0, 9))
            following = await send(s, idempotent(pid, 0, 4))
            newer = await send(s, idempotent(pid, 1, 0, tag=b"x"))
            fenced = await send(s, idempotent(pid, 0, 6))
            hwm = await high_water_mark(server)
            stored = metric_value(server, "figtank_stored_producer_states")
            answered = metric_value(
                server, 'figtank_kafka_producer_retries_total{known_from="stored"}')
    assert later > pid
    assert retried[:2] == (0, 2)  # the original's offset
    assert gap[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # still checked
    assert following[:2] == (0, 4)
    assert newer[:2] == (0, 6)
    assert fenced[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    assert hwm == 8
    assert stored == 1
    assert answered == 1


async def test_sequences_wrap_after_int32_max(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            s = await trio.open_tcp_stream(*server.kafka)
            pid = (await init_id(s)).producer_id
            top = (1 << 31) - 1
            first = await send(s, idempotent(pid, 0, top - 1, 3))  # top-1, top, 0
            again = await send(s, idempotent(pid, 0, top - 1, 3))
            gap = await send(s, idempotent(pid, 0, 0))
            wrapped = await send(s, idempotent(pid, 0, 1))
    assert first[:2] == again[:2] == (0, 0)
    assert gap[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert wrapped[:2] == (0, 3)


async def test_a_retry_after_sigkill_is_answered_as_the_original(tmp_path):
    """A ``figtank serve`` killed with SIGKILL after it stored a producer's batches: once
    restarted over the same data directory, the same batch (same producer id, epoch and
    sequence) is answered with the original's offset, not stored again, and the
    producer's next sequence is still checked."""
    args = ("--data-dir", str(tmp_path / "data"), "--durability", "fsync",
            "--kafka-listen", "127.0.0.1:0", "--tank-listen", "", "--figg-listen", "",
            "--metrics-listen", "")
    first = Served(*args)
    again = Served(*args)
    try:
        with trio.fail_after(60):
            served = await first.start()
            s = await trio.open_tcp_stream(*served.kafka)
            pid = (await init_id(s)).producer_id
            original = [await send(s, idempotent(pid, 0, seq)) for seq in (0, 2, 4)]
            await first.kill()
            served = await again.start()
            s = await trio.open_tcp_stream(*served.kafka)
            retried = await send(s, idempotent(pid, 0, 4))
            older = await send(s, idempotent(pid, 0, 2))
            gap = await send(s, idempotent(pid, 0, 8))
            following = await send(s, idempotent(pid, 0, 6))
    finally:
        first.close()
        again.close()
    assert [o[:2] for o in original] == [(0, 0), (0, 2), (0, 4)]
    assert retried[:2] == (0, 4) and older[:2] == (0, 2)
    assert gap[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert following[:2] == (0, 6)  # nothing was stored twice
