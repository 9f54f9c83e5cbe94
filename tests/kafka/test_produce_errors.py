"""Produce: a partition's batch the listener can not take is answered with the error code
Kafka gives that case (MESSAGE_TOO_LARGE, UNSUPPORTED_VERSION, CORRUPT_MESSAGE), not one
code for all; the other partitions of the request are appended."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from protocols.kafka import records as r
from protocols.kafka.batch import Record, RecordBatch, encode_batch, encode_records
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import kafka_server
from tests.kafka.raw import call


def _batch(value: bytes) -> bytes:
    recs = [Record(offset_delta=0, timestamp_delta=0, key=None, value=value)]
    return encode_batch(RecordBatch(base_offset=0, base_timestamp=1, max_timestamp=1,
                                    last_offset_delta=0), encode_records(recs), 1)


async def test_each_refused_batch_gets_its_own_error_code(tmp_path):
    big = _batch(b"x" * 4096)
    old_magic = bytearray(_batch(b"v"))
    old_magic[16] = 1  # magic 1: an older message format
    corrupt = bytearray(_batch(b"v"))
    corrupt[-1] ^= 0xFF  # the CRC no longer matches
    parts = [(0, big), (1, bytes(old_magic)), (2, bytes(corrupt)), (3, _batch(b"ok"))]
    async with kafka_server(tmp_path, max_bundle_bytes=1024,
                            default_partitions=4) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(
                topics=[r.MetadataRequestTopic(name="t")]))
            _, answer = await call(stream, ApiKey.PRODUCE, 7, r.ProduceRequest(
                acks=-1, timeout_ms=1000, topic_data=[r.TopicProduceData("t", [
                    r.PartitionProduceData(i, records) for i, records in parts])]), 2)
    codes = {p.index: p.error_code for p in answer.responses[0].partition_responses}
    assert codes == {0: ErrorCode.MESSAGE_TOO_LARGE, 1: ErrorCode.UNSUPPORTED_VERSION,
                     2: ErrorCode.CORRUPT_MESSAGE, 3: ErrorCode.NONE}


async def test_a_client_repeating_a_refused_produce_does_not_flood_the_log(tmp_path):
    corrupt = bytearray(_batch(b"v"))
    corrupt[-1] ^= 0xFF
    produce = r.ProduceRequest(acks=-1, timeout_ms=1000, topic_data=[
        r.TopicProduceData("t", [r.PartitionProduceData(0, bytes(corrupt))])])
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(20), capture_logs() as logs:
            for _ in range(2):  # two connections: each logs its first refusal
                stream = await trio.open_tcp_stream(*server.kafka)
                answers = [(await call(stream, ApiKey.PRODUCE, 7, produce, i))[1]
                           for i in range(50)]
                await stream.aclose()
    lines = [line for line in logs if line["event"] == "kafka_produce_refused"]
    assert all(a.responses[0].partition_responses[0].error_code == ErrorCode.CORRUPT_MESSAGE
               for a in answers)
    assert len(lines) == 2  # one per connection, not one per request
