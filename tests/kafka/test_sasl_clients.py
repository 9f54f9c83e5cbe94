"""SASL on the Kafka listener with the real clients (issue 17, "Access"): confluent-kafka
(librdkafka) and kafka-python log in with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 over
SASL_PLAINTEXT and SASL_SSL, produce and fetch; a wrong password is an authentication
error the client shows; the SASL user's permissions of the access policy apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import kafka.errors
import pytest
import trio
from kafka.structs import TopicPartition as KTopicPartition
from structlog.testing import capture_logs

from tests.kafka.helpers import CONFLUENT
from tests.kafka.sasl_helpers import MECHANISMS, PASSWORDS, address, failures, sasl_server
from tests.tls_certs import Certs


def confluent(addr: str, mechanism: str, user: str, password: str,
              certs: Certs | None) -> dict[str, Any]:
    config = {**CONFLUENT, "bootstrap.servers": addr, "sasl.mechanism": mechanism,
              "sasl.username": user, "sasl.password": password,
              "security.protocol": "SASL_SSL" if certs else "SASL_PLAINTEXT"}
    if certs is not None:
        config["ssl.ca.location"] = str(certs.ca_pem)
    return config


def produce(config: dict[str, Any], topic: str, values: list[bytes]) -> list[Any]:
    """Each delivery's error (None: written) and the errors the client reported."""
    errors: list[Any] = []
    producer = ck.Producer({**config, "acks": "all", "error_cb": errors.append})
    reports: list[Any] = []
    for value in values:
        producer.produce(topic, value=value, partition=0,
                         on_delivery=lambda err, msg: reports.append(err))
    producer.flush(8)
    return [reports, errors]


def consume(config: dict[str, Any], topic: str, count: int) -> list[bytes]:
    consumer = ck.Consumer({**config, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        for _ in range(50):
            if len(got) >= count:
                break
            for message in consumer.consume(count - len(got), timeout=0.2):
                assert message.error() is None, message.error()
                got.append(message.value())
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("tls", [False, True], ids=["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_librdkafka_logs_in_produces_and_fetches(tmp_path: Path, certs: Certs,
                                                       mechanism: str, tls: bool) -> None:
    values = [b"v%d" % i for i in range(5)]
    with capture_logs() as logs:
        async with sasl_server(tmp_path, certs if tls else None) as server:
            config = confluent(address(server, "secure" if tls else "kafka"), mechanism,
                               "alice", PASSWORDS["alice"], certs if tls else None)
            with trio.fail_after(20):
                reports, errors = await trio.to_thread.run_sync(produce, config, "t", values)
                got = await trio.to_thread.run_sync(consume, config, "t", 5)
    assert reports == [None] * 5 and errors == []
    assert got == values
    logins = [e for e in logs if e["event"] == "sasl_authenticated"]
    assert logins and {(e["user"], e["mechanism"]) for e in logins} == {("alice", mechanism)}


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_librdkafka_wrong_password_is_an_authentication_error(
        tmp_path: Path, certs: Certs, mechanism: str) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path, certs) as server:
            config = {**confluent(address(server, "secure"), mechanism, "alice", "wrong",
                                  certs), "message.timeout.ms": 1500}
            with trio.fail_after(20):
                reports, errors = await trio.to_thread.run_sync(produce, config, "t", [b"x"])
            assert failures(server, "secure", mechanism) >= 1
    assert reports and reports[0] is not None  # not written
    auth = [e for e in errors if e.code() == ck.KafkaError._AUTHENTICATION]
    assert auth, errors
    assert "Authentication failed" in auth[0].str()
    failed = [e for e in logs if e["event"] == "sasl_auth_failed"]
    assert failed and failed[0]["mechanism"] == mechanism and failed[0]["user"] == "alice"
    assert failed[0]["listener"] == "secure"


async def test_the_sasl_users_permissions_apply(tmp_path: Path) -> None:
    alice = confluent("", "SCRAM-SHA-512", "alice", PASSWORDS["alice"], None)
    reader = confluent("", "SCRAM-SHA-256", "reader", PASSWORDS["reader"], None)
    async with sasl_server(tmp_path) as server:
        for config in (alice, reader):
            config["bootstrap.servers"] = address(server)
        with trio.fail_after(20):
            written, _ = await trio.to_thread.run_sync(produce, alice, "guarded", [b"a"])
            refused, _ = await trio.to_thread.run_sync(produce, reader, "guarded", [b"r"])
            got = await trio.to_thread.run_sync(consume, reader, "guarded", 1)
            other, _ = await trio.to_thread.run_sync(produce, reader, "open", [b"o"])
    assert written == [None]
    assert [e.code() for e in refused] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert got == [b"a"]  # reader may read it
    assert other == [None]  # and write elsewhere (the default allows)


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_kafka_python_logs_in_produces_and_fetches(
        tmp_path: Path, certs: Certs, mechanism: str, caplog: pytest.LogCaptureFixture
        ) -> None:
    def script(addr: str, password: str) -> list[Any]:
        common = {"bootstrap_servers": addr, "security_protocol": "SASL_SSL",
                  "ssl_cafile": str(certs.ca_pem), "sasl_mechanism": mechanism,
                  "sasl_plain_username": "alice", "sasl_plain_password": password,
                  "request_timeout_ms": 5000}
        producer = kafka.KafkaProducer(acks=1, **common)
        offsets = [producer.send("kp", value=b"m%d" % i, partition=0).get(5).offset
                   for i in range(3)]
        producer.close(5)
        consumer = kafka.KafkaConsumer(enable_auto_commit=False, consumer_timeout_ms=3000,
                                       **common)
        tp = KTopicPartition("kp", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = [m.value for _, m in zip(range(3), consumer, strict=False)]
        consumer.close()
        return [offsets, got]

    def wrong(addr: str) -> str:
        try:
            kafka.KafkaProducer(
                bootstrap_servers=addr, security_protocol="SASL_SSL", bootstrap_timeout_ms=1500,
                ssl_cafile=str(certs.ca_pem), sasl_mechanism=mechanism,
                sasl_plain_username="alice", sasl_plain_password="wrong")
        except kafka.errors.KafkaError as exc:  # it retries until its bootstrap times out
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    async with sasl_server(tmp_path, certs) as server:
        with trio.fail_after(30):
            offsets, got = await trio.to_thread.run_sync(script, address(server, "secure"),
                                                         PASSWORDS["alice"])
            refused = await trio.to_thread.run_sync(wrong, address(server, "secure"))
    assert offsets == [0, 1, 2]
    assert got == [b"m0", b"m1", b"m2"]
    assert "KafkaTimeoutError" in refused
    shown = [r.getMessage() for r in caplog.records if r.name.startswith("kafka")]
    assert any("SaslAuthenticationFailedError" in m and "Authentication failed" in m
               for m in shown), shown[-5:]
