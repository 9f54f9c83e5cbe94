"""The access policy on the Kafka listener (issue 17), end to end with the real clients.

A mutual-TLS Kafka listener, where a client certificate's subject is the principal the
policy names, and two plain Kafka listeners acting as themselves: ``ops`` (everything,
to write the data) and ``writers`` (publish and subscribe, no create). Alice may read
``orders-*`` and nothing else: librdkafka and kafka-python get a clear authorization
error when producing, read her topic, do not see ``payments`` in Metadata and can not
create topics; each refusal is counted in ``figtank_access_denied`` and logged once.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import kafka.errors
import trio
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.structs import TopicPartition as KTopicPartition
from structlog.testing import capture_logs

from gateway.core.config import ListenerTable, Settings
from gateway.server.run import ServerInfo, open_server
from protocols.kafka import records as r
from protocols.kafka.types import ApiKey, ErrorCode
from tests.auth.helpers import denied
from tests.kafka.helpers import CONFLUENT
from tests.kafka.raw import call
from tests.kafka.test_kafka_requests import _batch
from tests.tls_certs import Certs

ALICE = "CN=alice,OU=ops,O=acme"
POLICY = """
default = "deny"

[[rule]]
who = ["CN=alice,OU=ops,O=acme"]
topics = ["orders-*"]
allow = ["subscribe"]

[[rule]]
who = ["listener:writers"]
topics = ["*"]
allow = ["publish", "subscribe"]

[[rule]]
who = ["listener:ops"]
topics = ["*"]
allow = ["publish", "subscribe", "create", "configure", "admin"]
"""


def _settings(tmp_path: Path, certs: Certs) -> Settings:
    policy = tmp_path / "access.toml"
    policy.write_text(POLICY)
    plain = {"protocol": "kafka", "address": "127.0.0.1:0", "tls": False}
    return Settings(data_dir=tmp_path / "data", durability="os", policy_file=policy,
                    kafka_listen="127.0.0.1:0", http_listen="", tank_listen="", figg_listen="",
                    metrics_listen="", tls_cert=str(certs.server_cert),
                    tls_key=str(certs.server_key), tls_client_ca=str(certs.ca_pem),
                    listeners={"ops": ListenerTable(**plain),
                               "writers": ListenerTable(**plain)})


def _addr(info: ServerInfo, name: str) -> str:
    host, port = info.addresses[name][:2]
    return f"{host}:{port}"


def _alice_confluent(certs: Certs) -> dict[str, Any]:
    return {**CONFLUENT, "security.protocol": "SSL", "ssl.ca.location": str(certs.ca_pem),
            "ssl.certificate.location": str(certs.client_cert),
            "ssl.key.location": str(certs.client_key)}


def _seed(addr: str) -> None:
    producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr, "linger.ms": 5})
    for topic in ("orders-1", "payments"):
        for i in range(5):
            producer.produce(topic, value=b"%s %d" % (topic.encode(), i), partition=0)
    assert producer.flush(10) == 0


def _confluent_alice(addr: str, certs: Certs) -> dict[str, Any]:
    config = {**_alice_confluent(certs), "bootstrap.servers": addr}
    reports: list[Any] = []
    producer = ck.Producer({**config, "message.timeout.ms": 3000, "retries": 0})
    producer.produce("orders-1", value=b"not allowed", partition=0,
                     on_delivery=lambda err, msg: reports.append(err))
    producer.flush(10)
    consumer = ck.Consumer({**config, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition("orders-1", 0, 0)])
        got: list[bytes] = []
        for _ in range(50):
            if len(got) >= 5:
                break
            for message in consumer.consume(5, timeout=0.2):
                assert message.error() is None, message.error()
                got.append(message.value())
        # A topic named in Metadata (kafka-python's test below lists them all).
        listed = {name for name in ("orders-1", "payments")
                  if consumer.list_topics(topic=name, timeout=5).topics[name].error is None}
    finally:
        consumer.close()
    admin = AdminClient(config)
    created = admin.create_topics([NewTopic("orders-new", 1)], operation_timeout=5)
    create_error = created["orders-new"].exception(10)
    return {"produce": reports, "read": got, "listed": listed, "create": create_error}


def _kafka_python_alice(addr: str, certs: Certs) -> dict[str, Any]:
    tls = {"bootstrap_servers": addr, "security_protocol": "SSL",
           "ssl_cafile": str(certs.ca_pem), "ssl_certfile": str(certs.client_cert),
           "ssl_keyfile": str(certs.client_key), "request_timeout_ms": 5000}
    producer = kafka.KafkaProducer(**tls, retries=0, max_block_ms=5000)
    try:
        future = producer.send("orders-1", b"not allowed", partition=0)
        try:
            future.get(timeout=10)
            produce_error: Exception | None = None
        except kafka.errors.KafkaError as exc:
            produce_error = exc
    finally:
        producer.close(timeout=5)
    consumer = kafka.KafkaConsumer(**tls, enable_auto_commit=False, group_id=None)
    try:
        where = KTopicPartition("orders-1", 0)
        consumer.assign([where])
        consumer.seek(where, 0)
        got: list[bytes] = []
        for _ in range(50):
            if len(got) >= 5:
                break
            for batch in consumer.poll(timeout_ms=200).values():
                got += [m.value for m in batch]
        listed = consumer.topics()
    finally:
        consumer.close()
    return {"produce": produce_error, "read": got, "listed": listed}


async def test_read_only_principal_through_tls_with_both_clients(tmp_path, certs):
    with capture_logs() as logs:
        async with open_server(_settings(tmp_path, certs), grace=0.2) as info:
            with trio.fail_after(60):
                await trio.to_thread.run_sync(_seed, _addr(info, "ops"))
                mtls = _addr(info, "kafka")
                rd = await trio.to_thread.run_sync(_confluent_alice, mtls, certs)
                kp = await trio.to_thread.run_sync(_kafka_python_alice, mtls, certs)
            counts = {op: denied(info, "kafka", op) for op in
                      ("publish", "create", "discover", "subscribe")}
            assert await info.backend.discover_partitions("orders-new") is None
            hwm = (await info.backend.discover_partitions("orders-1"))[0].high_water_mark
    assert [e.code() for e in rd["produce"]] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert rd["read"] == [b"orders-1 %d" % i for i in range(5)]
    assert "orders-1" in rd["listed"] and "payments" not in rd["listed"]
    assert rd["create"].args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert isinstance(kp["produce"], kafka.errors.TopicAuthorizationFailedError)
    assert kp["read"] == [b"orders-1 %d" % i for i in range(5)]
    assert "orders-1" in kp["listed"] and "payments" not in kp["listed"]
    assert hwm == 5  # nothing of alice's was appended
    assert counts["publish"] >= 2 and counts["create"] >= 1
    lines = [(e["identity"], e["topic"], e["operation"], e["request"])
             for e in logs if e["event"] == "access_denied"]
    assert (ALICE, "orders-1", "publish", "produce") in lines
    assert (ALICE, "orders-new", "create", "create_topics") in lines
    assert (ALICE, "payments", "discover", "metadata") in lines and counts["discover"] >= 1


async def test_raw_requests_refused_as_the_tank_listener_refuses(tmp_path, certs):
    """Every served API under the policy, for the ``writers`` listener (publish and
    subscribe on every topic, no create) and alice's counterpart refusals: a produce to a
    missing topic is not an auto-creation; a hidden topic is TOPIC_AUTHORIZATION_FAILED
    in Metadata, ListOffsets, Fetch and DescribeConfigs."""
    with capture_logs() as logs:
        async with open_server(_settings(tmp_path, certs), grace=0.2) as info:
            with trio.fail_after(20):
                await trio.to_thread.run_sync(_seed, _addr(info, "ops"))
                host, port = info.addresses["writers"][:2]
                stream = await trio.open_tcp_stream(host, port)
                _, made = await call(stream, ApiKey.PRODUCE, 7, r.ProduceRequest(
                    acks=1, timeout_ms=1000, topic_data=[
                        r.TopicProduceData("fresh", [r.PartitionProduceData(0, _batch(2))]),
                        r.TopicProduceData("orders-1", [r.PartitionProduceData(0, _batch(2))]),
                    ]), 1)
                _, meta = await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(
                    topics=[r.MetadataRequestTopic(name="fresh"),
                            r.MetadataRequestTopic(name="payments")],
                    allow_auto_topic_creation=True), 2)
                _, created = await call(stream, ApiKey.CREATE_TOPICS, 4, r.CreateTopicsRequest(
                    topics=[r.CreatableTopic(name="fresh", num_partitions=1,
                                             replication_factor=1)],
                    timeout_ms=1000), 3)
                _, found = await call(stream, ApiKey.FIND_COORDINATOR, 3,
                                      r.FindCoordinatorRequest(key="g"), 4)
                fresh = await info.backend.discover_partitions("fresh")
            assert denied(info, "writers", "create") >= 3
    answers = {t.name: [p.error_code for p in t.partition_responses] for t in made.responses}
    assert answers == {"fresh": [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION], "orders-1": [0]}
    assert [t.error_code for t in meta.topics] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0]
    assert created.topics[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert found.error_code == 0  # groups are not in the policy: the one node coordinates
    assert fresh is None  # neither the produce nor the metadata created it
    assert ("listener:writers", "fresh", "create", "produce") in [
        (f"listener:{e['listener']}", e["topic"], e["operation"], e["request"])
        for e in logs if e["event"] == "access_denied"]


async def test_hidden_topic_in_every_read_api(tmp_path, certs):
    """Alice's view of ``payments`` (no operation allowed on it), over TLS with raw
    requests: Metadata, ListOffsets, Fetch, DescribeConfigs refuse it and count it."""
    async with open_server(_settings(tmp_path, certs), grace=0.2) as info:
        with trio.fail_after(20):
            await trio.to_thread.run_sync(_seed, _addr(info, "ops"))
            context = ssl.create_default_context(cafile=str(certs.ca_pem))
            context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
            host, port = info.addresses["kafka"][:2]
            plain = await trio.open_tcp_stream(host, port)
            stream: Any = trio.SSLStream(plain, context, server_hostname="127.0.0.1")
            await stream.do_handshake()
            _, meta = await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(
                topics=[r.MetadataRequestTopic(name="payments"),
                        r.MetadataRequestTopic(name="orders-1")]), 1)
            _, offsets = await call(stream, ApiKey.LIST_OFFSETS, 5, r.ListOffsetsRequest(
                replica_id=-1, topics=[r.ListOffsetsTopic("payments", [
                    r.ListOffsetsPartition(partition_index=0, timestamp=-1)])]), 2)
            _, fetched = await call(stream, ApiKey.FETCH, 11, r.FetchRequest(
                replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, topics=[
                    r.FetchTopic("payments", [r.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]), 3)
            _, configs = await call(stream, ApiKey.DESCRIBE_CONFIGS, 1,
                                    r.DescribeConfigsRequest(resources=[
                                        r.DescribeConfigsResource(2, "payments", None)]), 4)
            counts = {op: denied(info, "kafka", op) for op in ("discover", "subscribe")}
    assert [t.error_code for t in meta.topics] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0]
    assert offsets.topics[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert (fetched.responses[0].partitions[0].error_code
            == ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    assert configs.results[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert counts["discover"] >= 2 and counts["subscribe"] >= 2
