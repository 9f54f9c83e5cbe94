"""Metadata for all topics: librdkafka 2.x's request (v12, with 3 bytes after its fields
that Kafka ignores) sent raw as captured, and list_topics() of the real clients
(confluent-kafka's AdminClient and Consumer, kafka-python's KafkaConsumer and
KafkaAdminClient), which must list every topic and keep the connection open."""

from __future__ import annotations

import struct

import confluent_kafka as ck
import kafka
import trio
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient

from gateway.server.run import ServerInfo
from protocols.kafka.messages import RESPONSES
from protocols.kafka.types import ApiKey
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.raw import read_frame
from tests.protocols.kafka.test_kafka_golden import (
    LIBRDKAFKA_METADATA_ALL_TOPICS,
    LIBRDKAFKA_METADATA_BROKERS_ONLY,
)

TOPICS = {"alpha": 1, "beta": 3}


async def _create(server: ServerInfo) -> None:
    for name, partitions in TOPICS.items():
        await server.backend.create_topic(name, partitions)


async def test_librdkafka_metadata_bytes_for_all_topics_answered_raw(tmp_path):
    async with kafka_server(tmp_path) as server:
        await _create(server)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            answers = []
            for payload in (LIBRDKAFKA_METADATA_BROKERS_ONLY, LIBRDKAFKA_METADATA_ALL_TOPICS,
                            LIBRDKAFKA_METADATA_BROKERS_ONLY):  # the connection still serves
                await stream.send_all(struct.pack(">i", len(payload)) + payload)
                answer = await read_frame(stream)
                assert answer is not None, "figtank closed the connection"
                cid = struct.unpack_from(">i", answer)[0]
                # Response header v1: correlation id, then no tagged fields.
                assert answer[4] == 0
                answers.append((cid, RESPONSES[ApiKey.METADATA].decode(answer[5:],
                                                                       version=12)))
            await stream.aclose()
    (cid1, brokers_only), (cid2, everything), (cid3, again) = answers
    assert (cid1, cid2, cid3) == (2, 3, 2)
    assert brokers_only.topics == [] and len(brokers_only.brokers) == 1
    assert {t.name: len(t.partitions) for t in everything.topics} == TOPICS
    assert all(t.error_code == 0 for t in everything.topics)
    assert again == brokers_only


async def test_list_topics_of_real_clients_lists_every_topic(tmp_path):
    def confluent(addr: str) -> list[set[str]]:
        admin = AdminClient({**CONFLUENT, "bootstrap.servers": addr})
        consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "g"})
        try:
            return [set(admin.list_topics(timeout=5).topics),
                    set(consumer.list_topics(timeout=5).topics)]
        finally:
            consumer.close()

    def kafka_python(addr: str) -> list[set[str]]:
        consumer = kafka.KafkaConsumer(bootstrap_servers=addr, request_timeout_ms=5000)
        admin = KafkaAdminClient(bootstrap_servers=addr, request_timeout_ms=5000)
        try:
            return [set(consumer.topics()), set(admin.list_topics())]
        finally:
            consumer.close()
            admin.close()

    async with kafka_server(tmp_path) as server:
        await _create(server)
        with trio.fail_after(30):
            listed = await trio.to_thread.run_sync(confluent, bootstrap(server))
            listed += await trio.to_thread.run_sync(kafka_python, bootstrap(server))
    assert listed == [set(TOPICS)] * 4
