"""The Kafka listener on the wire: version negotiation, offsets out of range, acks=0,
bad input and unserved APIs (each closes only its own connection)."""

from __future__ import annotations

import struct

import trio

from protocols.kafka import records as r
from protocols.kafka.batch import Record, RecordBatch, encode_batch, encode_records, read_batches
from protocols.kafka.messages import RESPONSES, SUPPORTED_VERSIONS, response_header_version
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import kafka_server
from tests.kafka.raw import call, read_frame, request


def _fetch(offset: int, wait_ms: int = 0) -> r.FetchRequest:
    return r.FetchRequest(replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20,
                          topics=[r.FetchTopic("t", [r.FetchPartition(
                              0, fetch_offset=offset, partition_max_bytes=1 << 20)])])


async def test_api_versions_lists_what_is_served_and_answers_a_too_new_one(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            _, ok = await call(stream, ApiKey.API_VERSIONS, 3, r.ApiVersionsRequest("t", "1"))
            header = r.encode_request_header(r.RequestHeader(ApiKey.API_VERSIONS, 99, 7, "x"))
            payload = header + b"\x00future body"
            await stream.send_all(struct.pack(">i", len(payload)) + payload)
            answer = await read_frame(stream)
    assert answer is not None
    cid = struct.unpack_from(">i", answer)[0]  # response header version 0
    newer = RESPONSES[ApiKey.API_VERSIONS].decode(answer[4:], version=0)
    served = {v.api_key: (v.min_version, v.max_version) for v in ok.api_keys}
    assert ok.error_code == 0
    assert served[ApiKey.PRODUCE] == SUPPORTED_VERSIONS[ApiKey.PRODUCE]
    assert {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA,
            ApiKey.API_VERSIONS} <= set(served)
    assert ApiKey.DELETE_TOPICS not in served  # not served: not advertised
    assert (cid, newer.error_code) == (7, ErrorCode.UNSUPPORTED_VERSION)
    assert {v.api_key for v in newer.api_keys} == set(served)


async def test_fetch_out_of_range_and_at_the_end(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            produce = r.ProduceRequest(acks=0, timeout_ms=1000, topic_data=[
                r.TopicProduceData("t", [r.PartitionProduceData(0, _batch(3))])])
            await stream.send_all(request(ApiKey.PRODUCE, 7, 1, produce))  # no answer
            _, meta = await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(
                topics=[r.MetadataRequestTopic(name="t")]), 2)
            while (await server.backend.discover_partitions("t"))[0].high_water_mark < 3:
                await trio.sleep(0.01)
            _, past = await call(stream, ApiKey.FETCH, 11, _fetch(4), 3)
            start = trio.current_time()
            _, end = await call(stream, ApiKey.FETCH, 11, _fetch(3, wait_ms=300), 4)
            waited = trio.current_time() - start
            _, data = await call(stream, ApiKey.FETCH, 11, _fetch(1), 5)
    assert meta.topics[0].error_code == 0 and meta.brokers[0].port == server.kafka[1]
    part = past.responses[0].partitions[0]
    assert (part.error_code, part.high_watermark) == (ErrorCode.OFFSET_OUT_OF_RANGE, 3)
    part = end.responses[0].partitions[0]
    assert (part.error_code, part.records) == (0, b"") and waited >= 0.25  # a long poll
    part = data.responses[0].partitions[0]
    assert part.error_code == 0 and part.records  # the whole batch from offset 0


def _batch(count: int) -> bytes:
    recs = [Record(offset_delta=i, timestamp_delta=0, key=None, value=b"v%d" % i)
            for i in range(count)]
    batch = RecordBatch(base_offset=0, base_timestamp=1, max_timestamp=1,
                        last_offset_delta=count - 1)
    return encode_batch(batch, encode_records(recs), count)


async def test_bad_input_and_unserved_apis_close_only_their_connection(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            good = await trio.open_tcp_stream(*server.kafka)
            garbage = await trio.open_tcp_stream(*server.kafka)
            await garbage.send_all(struct.pack(">i", 3) + b"\x00\x01\x02")
            assert await read_frame(garbage) is None  # closed
            huge = await trio.open_tcp_stream(*server.kafka)
            await huge.send_all(struct.pack(">i", 1 << 30))
            assert await read_frame(huge) is None  # over limits.max_frame_bytes
            group = await trio.open_tcp_stream(*server.kafka)
            header = r.encode_request_header(r.RequestHeader(ApiKey.DELETE_TOPICS, 4, 1, "x"))
            await group.send_all(struct.pack(">i", len(header) + 2) + header + b"\x00\x00")
            assert await read_frame(group) is None  # not served: closed, as Kafka does
            _, ok = await call(good, ApiKey.API_VERSIONS, 0, r.ApiVersionsRequest())
    assert ok.error_code == 0


async def test_find_coordinator_names_this_node_and_refuses_transactions(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            _, one = await call(stream, ApiKey.FIND_COORDINATOR, 2,
                                r.FindCoordinatorRequest(key="g"))
            _, many = await call(stream, ApiKey.FIND_COORDINATOR, 4,
                                 r.FindCoordinatorRequest(coordinator_keys=["a", "b"]))
            _, txn = await call(stream, ApiKey.FIND_COORDINATOR, 3,
                                r.FindCoordinatorRequest(key="tx", key_type=1))
    assert (one.error_code, one.node_id, one.host, one.port) == (0, 0, *server.kafka)
    assert [(c.key, c.error_code, c.host, c.port) for c in many.coordinators] == [
        ("a", 0, *server.kafka), ("b", 0, *server.kafka)]
    assert txn.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert "transactions" in txn.error_message


async def test_a_listener_on_every_interface_advertises_the_address_reached(tmp_path):
    async with kafka_server(tmp_path) as server:
        listener = server.listeners["kafka"]
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            # As if bound to 0.0.0.0 (tests stay on loopback): the connection was made
            # to 127.0.0.1, so that is what Metadata must name.
            listener.advertised = ("0.0.0.0", server.kafka[1])
            wildcard = listener.advertised_to(stream)
            listener.advertised = ("127.0.0.2", 9)
            given = listener.advertised_to(stream)
            await stream.aclose()
    assert wildcard == ("127.0.0.1", server.kafka[1])
    assert given == ("127.0.0.2", 9)


async def test_large_fetch_responses_go_out_whole_and_in_order_with_others(tmp_path):
    # Records of a few hundred kB are written as buffers of their own (a vectored write,
    # not copied into the response): pipelined with small answers, each arrives whole.
    values = [bytes([i % 251]) * 1000 for i in range(600)]
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            for n in range(3):
                produce = r.ProduceRequest(acks=1, timeout_ms=1000, topic_data=[
                    r.TopicProduceData("t", [r.PartitionProduceData(0, _batch_of(
                        values[n * 200:(n + 1) * 200], n * 200))])])
                _, done = await call(stream, ApiKey.PRODUCE, 7, produce, n)
                assert done.responses[0].partition_responses[0].error_code == 0
            asks = [(ApiKey.FETCH, 11, _fetch(0)), (ApiKey.API_VERSIONS, 3,
                    r.ApiVersionsRequest("t", "1")), (ApiKey.FETCH, 4, _fetch(250)),
                    (ApiKey.FETCH, 12, _fetch(0))]
            await stream.send_all(b"".join(request(key, version, 10 + i, body)
                                           for i, (key, version, body) in enumerate(asks)))
            got = bytearray()
            answers = []
            while len(answers) < len(asks):
                while len(got) < 4 or len(got) < 4 + struct.unpack_from(">i", got)[0]:
                    data = await stream.receive_some(1 << 16)
                    assert data, "the connection closed"
                    got += data
                size = struct.unpack_from(">i", got)[0]
                answers.append(bytes(got[4:4 + size]))
                del got[:4 + size]
    for i, ((key, version, _), payload) in enumerate(zip(asks, answers, strict=True)):
        header, pos = r.read_response_header(payload, 0, len(payload),
                                             response_header_version(key, version))
        body = RESPONSES[key].decode(payload[pos:], version=version)
        assert header.correlation_id == 10 + i
        if key != ApiKey.FETCH:
            continue
        part = body.responses[0].partitions[0]
        assert part.error_code == 0 and part.high_watermark == 600
        records = [rec for batch in read_batches(part.records).batches
                   for rec in batch.records]
        first = 0 if i != 2 else 200  # whole batches: offset 250 is in the second
        assert [rec.value for rec in records] == values[first:]


def _batch_of(values: list[bytes], base: int) -> bytes:
    recs = [Record(offset_delta=i, timestamp_delta=0, key=None, value=v)
            for i, v in enumerate(values)]
    batch = RecordBatch(base_offset=base, base_timestamp=1, max_timestamp=1,
                        last_offset_delta=len(values) - 1)
    return encode_batch(batch, encode_records(recs), len(values))
