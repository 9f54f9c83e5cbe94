"""OffsetCommit / OffsetFetch / OffsetDelete: real confluent-kafka and kafka-python
commits read back, raw requests for the error codes and the limits, and commits that
outlive the server."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import kafka
import trio
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KTopicPartition

from gateway.kafka.groups.offsets import FILE_NAME
from protocols.kafka.records import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
)
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.raw import call
from tests.kafka.test_real_clients import produce


def _commit_body(group: str, parts: list[tuple[str, int, int, str | None]], *,
                 generation: int = -1, member: str = "") -> OffsetCommitRequest:
    topics: dict[str, list[OffsetCommitRequestPartition]] = {}
    for topic, index, offset, meta in parts:
        topics.setdefault(topic, []).append(OffsetCommitRequestPartition(
            partition_index=index, committed_offset=offset, committed_metadata=meta))
    return OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation,
                               member_id=member, topics=[
                                   OffsetCommitRequestTopic(t, p) for t, p in topics.items()])


async def _raw(server: Any, api_key: int, version: int, body: Any) -> Any:
    assert server.kafka is not None
    stream = await trio.open_tcp_stream(*server.kafka)
    async with stream:
        return (await call(stream, api_key, version, body))[1]


def _codes(response: Any) -> list[tuple[str, int, int]]:
    return [(t.name, p.partition_index, p.error_code)
            for t in response.topics for p in t.partitions]


async def _topic(server: Any, name: str, partitions: int) -> None:
    await server.backend.create_topic(name, partitions)


async def test_confluent_assign_commit_and_auto_commit_read_back(tmp_path):
    def script(addr: str) -> list[Any]:
        produce(addr, "orders", [(None, b"m%d" % i) for i in range(10)])
        consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "g1",
                                "enable.auto.commit": False})
        tp = ck.TopicPartition("orders", 0, 0)
        consumer.assign([tp])
        got = []
        while len(got) < 4:
            got += [m.offset() for m in consumer.consume(4 - len(got), timeout=1)]
        consumer.commit(asynchronous=False)  # the position: after the 4th message
        committed = consumer.committed([ck.TopicPartition("orders", 0)], timeout=5)
        consumer.close()
        auto = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "g2",
                            "enable.auto.commit": True, "auto.commit.interval.ms": 100})
        auto.assign([ck.TopicPartition("orders", 0, 3)])
        read = []
        while len(read) < 7:
            read += [m.offset() for m in auto.consume(7 - len(read), timeout=1)]
        auto.close()  # commits the position on close
        again = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "g2"})
        auto_committed = again.committed([ck.TopicPartition("orders", 0)], timeout=5)
        again.close()
        return [got, committed[0].offset, read, auto_committed[0].offset]

    async with kafka_server(tmp_path) as server:
        with trio.fail_after(30):
            got, committed, read, auto_committed = await trio.to_thread.run_sync(
                script, bootstrap(server))
        stored = server.offsets.committed("g1")
        v1 = await _raw(server, ApiKey.OFFSET_FETCH, 1, OffsetFetchRequest(
            group_id="g2", topics=[OffsetFetchRequestTopic("orders", [0, 1])]))
        v8 = await _raw(server, ApiKey.OFFSET_FETCH, 8, OffsetFetchRequest(groups=[
            OffsetFetchRequestGroup("g1", topics=None),
            OffsetFetchRequestGroup("nobody", topics=[OffsetFetchRequestTopics("orders", [0])])]))
    assert got == [0, 1, 2, 3] and committed == 4
    assert stored[("orders", 0)].offset == 4
    assert read == list(range(3, 10)) and auto_committed == 10
    assert [(p.partition_index, p.committed_offset, p.error_code)
            for p in v1.topics[0].partitions] == [(0, 10, 0), (1, -1, 0)]
    g1, nobody = v8.groups
    assert (g1.group_id, g1.topics[0].name, g1.topics[0].partitions[0].committed_offset) == (
        "g1", "orders", 4)
    assert nobody.topics[0].partitions[0].committed_offset == -1


async def test_kafka_python_commits_and_reads_back(tmp_path):
    def script(addr: str) -> list[Any]:
        produce(addr, "kpc", [(None, b"x%d" % i) for i in range(6)])
        consumer = kafka.KafkaConsumer(bootstrap_servers=addr, group_id="kp-group",
                                       enable_auto_commit=False, consumer_timeout_ms=3000,
                                       request_timeout_ms=5000)
        tp = KTopicPartition("kpc", 0)
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(5, "where I was", -1)})
        committed = consumer.committed(tp)
        consumer.close()
        other = kafka.KafkaConsumer(bootstrap_servers=addr, group_id="kp-group",
                                    enable_auto_commit=False, request_timeout_ms=5000)
        other.assign([tp])
        first = next(iter(other)).offset  # starts from the committed offset
        other.close()
        return [committed, first]

    async with kafka_server(tmp_path) as server:
        with trio.fail_after(30):
            committed, first = await trio.to_thread.run_sync(script, bootstrap(server))
        stored = server.offsets.get("kp-group", "kpc", 0)
    assert committed == 5 and first == 5
    assert stored is not None and stored.metadata == "where I was"


async def test_commit_errors_and_offset_delete(tmp_path):
    async with kafka_server(tmp_path, offsets_metadata_max_bytes=10) as server:
        await _topic(server, "t", 2)
        ok = await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body(
            "g", [("t", 0, 5, None), ("t", 1, 7, "x" * 11), ("t", 2, 1, None),
                  ("missing", 0, 1, None)]))
        # No members: a generation >= 0 is from a group figtank does not know of ...
        unknown = await _raw(server, ApiKey.OFFSET_COMMIT, 2, _commit_body(
            "nobody", [("t", 0, 1, None)], generation=3, member="m-1"))
        # ... and a member of an empty group that is no member.
        empty = await _raw(server, ApiKey.OFFSET_COMMIT, 7, _commit_body(
            "g", [("t", 0, 1, None)], generation=1, member="m-1"))
        no_group = await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body(
            "", [("t", 0, 1, None)]))
        deleted = await _raw(server, ApiKey.OFFSET_DELETE, 0, OffsetDeleteRequest("g", [
            OffsetDeleteRequestTopic("t", [OffsetDeleteRequestPartition(0)])]))
        not_found = await _raw(server, ApiKey.OFFSET_DELETE, 0, OffsetDeleteRequest("zz", []))
        left = server.offsets.committed("g")
    assert _codes(ok) == [("t", 0, 0), ("t", 1, ErrorCode.OFFSET_METADATA_TOO_LARGE),
                          ("t", 2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                          ("missing", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert _codes(unknown) == [("t", 0, ErrorCode.ILLEGAL_GENERATION)]
    assert _codes(empty) == [("t", 0, ErrorCode.UNKNOWN_MEMBER_ID)]
    assert _codes(no_group) == [("t", 0, ErrorCode.INVALID_GROUP_ID)]
    assert deleted.error_code == 0 and _codes(deleted) == [("t", 0, 0)]
    assert not_found.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert left == {}


async def test_max_entries_and_max_bytes_refuse_with_a_metric(tmp_path):
    async with kafka_server(tmp_path, offsets_max_entries=3, offsets_max_bytes=400) as server:
        await _topic(server, "t", 4)
        first = await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body(
            "g", [("t", i, 1, None) for i in range(4)]))
        again = await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body(
            "g", [("t", 0, 2, None)]))  # an update of one kept: no new entry
        big = await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body(
            "g", [("t", 1, 3, "m" * 300)]))
        hits = server.metrics_registry.render().decode()
    assert [c for _, _, c in _codes(first)] == [0, 0, 0, ErrorCode.INVALID_COMMIT_OFFSET_SIZE]
    assert _codes(again) == [("t", 0, 0)]
    assert _codes(big) == [("t", 1, ErrorCode.INVALID_COMMIT_OFFSET_SIZE)]
    assert 'figtank_limit_hits_total{limit="offsets.max_entries"} 1.0' in hits
    assert 'figtank_limit_hits_total{limit="offsets.max_bytes"} 1.0' in hits


async def test_commits_survive_a_restart_and_the_file_is_a_regular_file(tmp_path):
    async with kafka_server(tmp_path) as server:
        await _topic(server, "t", 1)
        await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body("g", [("t", 0, 42, "m")]))
    data = tmp_path / "data"
    async with kafka_server(tmp_path) as server:
        fetched = await _raw(server, ApiKey.OFFSET_FETCH, 7, OffsetFetchRequest(
            group_id="g", topics=None))
        topics = [t.name for t in await server.backend.discover_topics()]
    p = fetched.topics[0].partitions[0]
    assert (fetched.topics[0].name, p.committed_offset, p.metadata) == ("t", 42, "m")
    # The Tank layout rule: no directory added beside the topics, one regular file.
    entries = sorted(e.name for e in data.iterdir())
    assert entries == [FILE_NAME, "t"]
    assert (data / FILE_NAME).is_file() and topics == ["t"]


async def test_committed_lag_metric(tmp_path):
    async with kafka_server(tmp_path) as server:
        await _topic(server, "lagging", 1)
        await trio.to_thread.run_sync(
            produce, bootstrap(server), "lagging", [(None, b"v")] * 10)
        await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body(
            "g", [("lagging", 0, 4, None)]))
        from gateway.kafka.groups.lag import CommittedLag

        lag = CommittedLag(server.offsets, server.backend, server.metrics_registry, 1,
                           register=False)
        await lag.refresh()
        samples = lag.samples()
        await _raw(server, ApiKey.OFFSET_COMMIT, 8, _commit_body(
            "h", [("lagging", 0, 10, None)]))
        capped = lag.samples()
        rendered = server.metrics_registry.render().decode()
    assert samples == [(["g", "lagging", "0"], 6.0)]
    assert capped == [(["g", "lagging", "0"], 6.0)]  # one series at most: h is left out
    assert 'figtank_limit_hits_total{limit="offsets.lag_series"}' in rendered
    # The server's own gauge (refreshed at start, before the commits: no sample yet).
    assert "# TYPE figtank_committed_lag_messages gauge" in rendered
    assert "figtank_committed_offsets 2.0" in rendered
