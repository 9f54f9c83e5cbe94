"""ListOffsets with a partition named more than once. Raw: every entry of a duplicated
partition is INVALID_REQUEST (as Kafka answers), the others are answered. librdkafka:
offsets_for_times merges entries for the same partition before asking (the last one's
time wins) and gives all of them that one answer; entries for different partitions each
get their own."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import trio

from protocols.kafka import records as r
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.raw import call
from tests.kafka.test_real_clients import produce

STAMPS = [1_700_000_000_000 + 1000 * i for i in range(10)]


def _ask(*topics: tuple[str, list[tuple[int, int]]]) -> r.ListOffsetsRequest:
    return r.ListOffsetsRequest(replica_id=-1, topics=[
        r.ListOffsetsTopic(name, [r.ListOffsetsPartition(p, timestamp=ts) for p, ts in parts])
        for name, parts in topics])


def _answers(response: Any) -> list[tuple[str, int, int, int]]:
    return [(t.name, p.partition_index, p.error_code, p.offset)
            for t in response.topics for p in t.partitions]


async def test_duplicated_partitions_are_invalid_request_raw(tmp_path):
    async with kafka_server(tmp_path) as server:
        await server.backend.create_topic("times", 2)
        with trio.fail_after(20):
            await trio.to_thread.run_sync(lambda: produce(
                bootstrap(server), "times", [(None, b"%d" % i) for i in range(10)],
                timestamps=STAMPS))
            stream = await trio.open_tcp_stream(*server.kafka)
            answers = []
            for version in (1, 7):
                _, same_topic = await call(stream, ApiKey.LIST_OFFSETS, version, _ask(
                    ("times", [(0, STAMPS[2]), (0, STAMPS[6]), (1, -1)])))
                # The same partition under two entries of its topic is a duplicate too.
                _, two_entries = await call(stream, ApiKey.LIST_OFFSETS, version, _ask(
                    ("times", [(0, STAMPS[2])]), ("times", [(0, -1), (1, -2)])))
                _, once_each = await call(stream, ApiKey.LIST_OFFSETS, version, _ask(
                    ("times", [(0, STAMPS[2]), (1, -1)])))
                answers.append([_answers(same_topic), _answers(two_entries),
                                _answers(once_each)])
    invalid = ErrorCode.INVALID_REQUEST
    for same_topic, two_entries, once_each in answers:
        assert same_topic == [("times", 0, invalid, -1), ("times", 0, invalid, -1),
                              ("times", 1, 0, 0)]
        assert two_entries == [("times", 0, invalid, -1), ("times", 0, invalid, -1),
                               ("times", 1, 0, 0)]
        assert once_each == [("times", 0, 0, 2), ("times", 1, 0, 0)]


async def test_librdkafka_offsets_for_times_with_repeated_partitions(tmp_path):
    def script(addr: str) -> list[list[int]]:
        produce(addr, "times", [(None, b"%d" % i) for i in range(10)], timestamps=STAMPS)
        consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "u"})
        try:
            def ask(*entries: tuple[int, int]) -> list[int]:
                found = consumer.offsets_for_times(
                    [ck.TopicPartition("times", p, ts) for p, ts in entries], timeout=5)
                assert all(tp.error is None for tp in found)
                return [tp.offset for tp in found]
            return [ask((0, STAMPS[2]), (0, STAMPS[6])),  # the last time wins for both
                    ask((0, STAMPS[6]), (0, STAMPS[2])),
                    ask((0, STAMPS[3]), (0, STAMPS[9] + 1)),  # past the end: -1 for both
                    ask((0, STAMPS[2]), (1, STAMPS[2]), (0, STAMPS[7])),
                    ask((0, STAMPS[2])), ask((0, STAMPS[6]))]
        finally:
            consumer.close()

    async with kafka_server(tmp_path) as server:
        await server.backend.create_topic("times", 2)
        with trio.fail_after(30):
            got = await trio.to_thread.run_sync(script, bootstrap(server))
    assert got == [[6, 6], [2, 2], [-1, -1], [7, -1, 7], [2], [6]]
