"""CreateTopics and DescribeConfigs on the Kafka listener, with the real admin clients
(confluent-kafka's AdminClient, which is librdkafka, and kafka-python's KafkaAdminClient)."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import trio
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KNewTopic

from protocols.kafka import records as r
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.raw import call


def _create(addr: str, topics: list[NewTopic], **options: Any) -> dict[str, Any]:
    """Each topic's outcome: None when created, else the KafkaError."""
    admin = AdminClient({**CONFLUENT, "bootstrap.servers": addr})
    outcomes: dict[str, Any] = {}
    for name, future in admin.create_topics(topics, operation_timeout=5,
                                            request_timeout=10, **options).items():
        try:
            future.result(timeout=10)
            outcomes[name] = None
        except ck.KafkaException as exc:
            outcomes[name] = exc.args[0]
    return outcomes


def _describe(addr: str, topic: str) -> dict[str, Any]:
    admin = AdminClient({**CONFLUENT, "bootstrap.servers": addr})
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)],
                                     request_timeout=10)
    (future,) = futures.values()
    return future.result(timeout=10)


async def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))


async def test_librdkafka_creates_topics_with_and_without_configs(tmp_path):
    async with kafka_server(tmp_path, default_partitions=3) as server:
        addr = bootstrap(server)
        outcomes = await _in_thread(_create, addr, [
            NewTopic("plain", num_partitions=2, replication_factor=1),
            NewTopic("defaults"),  # -1 partitions and replicas: the broker's defaults
            NewTopic("tuned", num_partitions=1, config={
                "segment.bytes": "1048576", "retention.ms": "7200000",
                "retention.bytes": "5000000", "segment.ms": "600000"})])
        assert outcomes == {"plain": None, "defaults": None, "tuned": None}
        store = server.backend.store  # type: ignore[attr-defined]
        assert len(store.topic("plain").partitions) == 2
        assert len(store.topic("defaults").partitions) == 3
        tuned = store.topic("tuned").config
        assert (tuned.segment_bytes, tuned.retention_secs, tuned.retention_bytes,
                tuned.roll_secs) == (1048576, 7200, 5000000, 600)
        # the config is the topic's own (a Tank config file), as Tank's CreateTopic makes it
        assert "log.retention.secs=7200" in (tmp_path / "data" / "tuned" / "config").read_text()


async def test_librdkafka_create_refusals_have_kafka_codes_and_reasons(tmp_path):
    async with kafka_server(tmp_path) as server:
        addr = bootstrap(server)
        assert await _in_thread(_create, addr, [NewTopic("taken", 1)]) == {"taken": None}
        outcomes = await _in_thread(_create, addr, [
            NewTopic("taken", 1),
            NewTopic("odd", 1, config={"compression.type": "zstd"}),
            NewTopic("tiny", 1, config={"segment.bytes": "64"}),
            NewTopic("replicated", 1, replication_factor=3),
            NewTopic("bad/name", 1)])
        codes = {name: err.code() for name, err in outcomes.items()}
        assert codes == {"taken": ck.KafkaError.TOPIC_ALREADY_EXISTS,
                         "odd": ck.KafkaError.INVALID_CONFIG,
                         "tiny": ck.KafkaError.INVALID_CONFIG,
                         "replicated": ck.KafkaError.INVALID_REPLICATION_FACTOR,
                         "bad/name": ck.KafkaError.TOPIC_EXCEPTION}
        assert "compression.type" in outcomes["odd"].str()
        assert "below the minimum" in outcomes["tiny"].str()
        for name in ("odd", "tiny", "replicated"):
            assert server.backend.store.topic(name) is None  # type: ignore[attr-defined]


async def test_validate_only_creates_nothing(tmp_path):
    async with kafka_server(tmp_path) as server:
        addr = bootstrap(server)
        outcomes = await _in_thread(_create, addr, [
            NewTopic("dry", 2), NewTopic("dry-bad", 1, config={"flush.ms": "5"})],
            validate_only=True)
        assert outcomes["dry"] is None
        assert outcomes["dry-bad"].code() == ck.KafkaError.INVALID_CONFIG
        assert await server.backend.discover_partitions("dry") is None


async def test_a_store_limit_refuses_with_its_reason(tmp_path):
    async with kafka_server(tmp_path, max_topics=1) as server:
        addr = bootstrap(server)
        outcomes = await _in_thread(_create, addr, [NewTopic("one", 1)])
        assert outcomes == {"one": None}
        refused = (await _in_thread(_create, addr, [NewTopic("two", 1)]))["two"]
        assert refused.code() == ck.KafkaError.POLICY_VIOLATION
        assert "max_topics" in refused.str()


async def test_the_access_policy_guards_creation(tmp_path):
    policy = tmp_path / "access.toml"
    policy.write_text('default = "deny"\n[[rule]]\nwho = ["listener:kafka"]\n'
                      'topics = ["ok-*"]\nallow = ["create", "publish", "subscribe"]\n')
    async with kafka_server(tmp_path, policy_file=policy) as server:
        outcomes = await _in_thread(_create, bootstrap(server),
                                    [NewTopic("ok-1", 1), NewTopic("no-1", 1)])
        assert outcomes["ok-1"] is None
        assert outcomes["no-1"].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert await server.backend.discover_partitions("no-1") is None


async def test_librdkafka_describes_a_topics_config(tmp_path):
    async with kafka_server(tmp_path, topic_config={"log.retention.bytes": "9000000"}
                            ) as server:
        addr = bootstrap(server)
        await _in_thread(_create, addr, [NewTopic("described", 1, config={
            "retention.ms": "3600000", "segment.bytes": "2097152"})])
        entries = await _in_thread(_describe, addr, "described")
        unknown = None
        try:
            await _in_thread(_describe, addr, "missing")
        except ck.KafkaException as exc:
            unknown = exc.args[0].code()
    values = {name: entry.value for name, entry in entries.items()}
    assert values["retention.ms"] == "3600000"
    assert values["segment.bytes"] == "2097152"
    assert values["retention.bytes"] == "9000000"  # topics.config
    assert values["flush.ms"] == str(2**63 - 1)  # Tank's 0: never
    assert values["segment.ms"] == str(7 * 86400 * 1000)  # Tank's default roll: a week
    assert values["retention.segments.count"] == "0"  # a Tank key with no Kafka name
    assert entries["retention.ms"].source == ck.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert (entries["retention.bytes"].source
            == ck.admin.ConfigSource.STATIC_BROKER_CONFIG.value)
    assert entries["segment.ms"].is_default and entries["segment.ms"].is_read_only
    assert unknown == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


async def test_kafka_python_creates_topics(tmp_path):
    def script(addr: str) -> tuple[list[Any], list[Any]]:
        admin = KafkaAdminClient(bootstrap_servers=addr, request_timeout_ms=5000)
        try:
            created = admin.create_topics([KNewTopic("kp", 2, 1, topic_configs={
                "retention.bytes": "1000000"})])
            try:
                again: Any = admin.create_topics([KNewTopic("kp", 2, 1)], validate_only=True)
            except Exception as exc:  # kafka-python raises the topic's error
                again = exc
        finally:
            admin.close()
        return created, again

    async with kafka_server(tmp_path) as server:
        created, again = await _in_thread(script, bootstrap(server))
        topic = server.backend.store.topic("kp")  # type: ignore[attr-defined]
    assert len(topic.partitions) == 2 and topic.config.retention_bytes == 1000000
    (answer,) = created["topics"]  # version 5+: the topic's partitions and config
    assert (answer["error_code"], answer["num_partitions"], answer["replication_factor"]) == (
        0, 2, 1)
    assert answer["configs"]["retention.bytes"]["value"] == "1000000"
    assert type(again).__name__ == "TopicAlreadyExistsError"


async def test_a_topic_named_twice_in_one_request_is_refused_and_not_created(tmp_path):
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            _, answer = await call(stream, ApiKey.CREATE_TOPICS, 5, r.CreateTopicsRequest(
                topics=[r.CreatableTopic("twice", 1, 1), r.CreatableTopic("twice", 2, 1),
                        r.CreatableTopic("once", 1, 1)], timeout_ms=1000))
        assert [(t.name, t.error_code) for t in answer.topics] == [
            ("twice", ErrorCode.INVALID_REQUEST), ("twice", ErrorCode.INVALID_REQUEST),
            ("once", ErrorCode.NONE)]
        assert await server.backend.discover_partitions("twice") is None
