"""SaslHandshake version 0 (KIP-43) on a SASL listener: after it the SASL tokens travel as
raw size-framed frames both ways; success switches back to Kafka requests served as the
user, a failure closes the connection without an answer (as Kafka does) with the
``sasl_auth_failed`` line and the failure metric. Raw exchanges for PLAIN and
SCRAM-SHA-256/512, and kafka-python told a 0.11 broker (its SaslHandshake v0 path)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import kafka
import pytest
import trio
from kafka.structs import TopicPartition as KTopicPartition
from structlog.testing import capture_logs

import protocols.kafka.records as r
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.raw import call, read_frame, request
from tests.kafka.sasl_helpers import PASSWORDS, address, failures, sasl_server
from tests.kafka.scram_client import ScramClient

SCRAMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


async def connect(server: Any) -> trio.SocketStream:
    return await trio.open_tcp_stream(*server.addresses["kafka"])


async def handshake_v0(stream: trio.SocketStream, mechanism: str) -> Any:
    _, answer = await call(stream, ApiKey.SASL_HANDSHAKE, 0, r.SaslHandshakeRequest(mechanism))
    return answer


async def raw(stream: trio.SocketStream, token: bytes) -> bytes | None:
    """Send a raw token; the raw answer, or None when the server closed instead."""
    await stream.send_all(struct.pack(">i", len(token)) + token)
    with trio.fail_after(5):
        return await read_frame(stream)


async def closed(stream: trio.SocketStream) -> bool:
    with trio.fail_after(5):
        return await read_frame(stream) is None


def metadata(topic: str) -> r.MetadataRequest:
    return r.MetadataRequest(topics=[r.MetadataRequestTopic(name=topic)])


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


@pytest.mark.parametrize("mechanism", SCRAMS)
async def test_a_raw_scram_login_then_requests_as_the_user(tmp_path: Path,
                                                           mechanism: str) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                _, versions = await call(stream, ApiKey.API_VERSIONS, 3,
                                         r.ApiVersionsRequest("t", "1"))
                shake = await handshake_v0(stream, mechanism)
                client = ScramClient(mechanism, "reader", PASSWORDS["reader"])
                first = await raw(stream, client.first())
                assert first is not None
                final = await raw(stream, client.final(first))
                assert final is not None
                _, meta = await call(stream, ApiKey.METADATA, 9, metadata("t"), 3)
                # Acting as user:reader, whom the policy forbids to write "guarded".
                _, produced = await call(stream, ApiKey.PRODUCE, 8, r.ProduceRequest(
                    acks=1, timeout_ms=1000, topic_data=[r.TopicProduceData("guarded", [
                        r.PartitionProduceData(0, None)])]), 4)
    served = {v.api_key: (v.min_version, v.max_version) for v in versions.api_keys}
    assert served[ApiKey.SASL_HANDSHAKE] == (0, 1)
    assert shake.error_code == 0 and mechanism in shake.mechanisms
    assert first.startswith(b"r=" + client.nonce.encode())
    assert client.verify(final)  # the server knows the credential
    assert meta.topics[0].name == "t"
    assert produced.responses[0].partition_responses[0].error_code == \
        ErrorCode.TOPIC_AUTHORIZATION_FAILED
    login = events(logs, "sasl_authenticated")
    assert [(e["user"], e["mechanism"], e["raw"]) for e in login] == [
        ("reader", mechanism, True)]


async def test_a_raw_plain_login(tmp_path: Path) -> None:
    async with sasl_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await connect(server)
            shake = await handshake_v0(stream, "PLAIN")
            answer = await raw(stream, b"\0alice\0" + PASSWORDS["alice"].encode())
            _, meta = await call(stream, ApiKey.METADATA, 9, metadata("t"), 3)
            user_quota = server.quotas.get("user:alice")
    assert shake.error_code == 0
    assert answer == b""  # an empty token: PLAIN's success, as Kafka answers it
    assert meta.topics[0].name == "t"
    assert user_quota is not None  # the user's quota buckets, not the listener's


async def test_the_handshake_and_first_token_may_come_together(tmp_path: Path) -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", PASSWORDS["alice"])
    token = client.first()
    async with sasl_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await connect(server)
            await stream.send_all(request(ApiKey.SASL_HANDSHAKE, 0, 1, r.SaslHandshakeRequest(
                "SCRAM-SHA-256")) + struct.pack(">i", len(token)) + token)
            both = b""
            while len(both) < 8 or len(both) < 8 + sum(struct.unpack_from(">i", both)):
                both += await stream.receive_some(65536)
            size = struct.unpack_from(">i", both)[0]
            first = both[4 + size + 4:]
            final = await raw(stream, client.final(first))
            _, meta = await call(stream, ApiKey.METADATA, 9, metadata("t"), 3)
    assert final is not None and client.verify(final)
    assert meta.topics[0].name == "t"



@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAMS])
async def test_a_wrong_password_closes_without_an_answer(tmp_path: Path,
                                                         mechanism: str) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                assert (await handshake_v0(stream, mechanism)).error_code == 0
                if mechanism == "PLAIN":
                    answer = await raw(stream, b"\0alice\0wrong")
                else:
                    client = ScramClient(mechanism, "alice", "wrong")
                    first = await raw(stream, client.first())
                    assert first is not None
                    answer = await raw(stream, client.final(first))
                counted = failures(server, "kafka", mechanism)
    assert answer is None  # closed, nothing sent: Kafka's v0 failure
    assert counted == 1
    failed = events(logs, "sasl_auth_failed")
    assert [(e["listener"], e["mechanism"], e["user"]) for e in failed] == [
        ("kafka", mechanism, "alice")]
    assert "Authentication failed" in failed[0]["reason"]
    close = events(logs, "connection_closed")
    assert close and close[0]["kind"] == "sasl_failed"
    assert not [e for e in logs if e.get("exc_info")]


@pytest.mark.parametrize(("mechanism", "token", "says"), [
    ("SCRAM-SHA-256", b"n,,r=abc", "malformed client-first"),
    ("SCRAM-SHA-512", b"\xff\xfe", "not UTF-8"),
    ("PLAIN", b"alice-without-nuls", "malformed token"),
    # A Kafka request where a token belongs: just a token, and a malformed one.
    ("SCRAM-SHA-256", request(ApiKey.METADATA, 9, 2, metadata("t"))[4:],
     "malformed client-first"),
])
async def test_a_malformed_token_is_a_clear_failure(tmp_path: Path, mechanism: str,
                                                    token: bytes, says: str) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                assert (await handshake_v0(stream, mechanism)).error_code == 0
                answer = await raw(stream, token)
                counted = failures(server, "kafka", mechanism)
    assert answer is None and counted == 1
    failed = events(logs, "sasl_auth_failed")
    assert len(failed) == 1 and says in failed[0]["reason"]
    assert not [e for e in logs if e.get("exc_info")]


async def test_an_oversized_token_closes_the_connection(tmp_path: Path) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path, max_frame_bytes=1024) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                assert (await handshake_v0(stream, "SCRAM-SHA-256")).error_code == 0
                await stream.send_all(struct.pack(">i", 1025))
                assert await closed(stream)
    close = events(logs, "connection_closed")
    assert close and "1025" in close[0]["reason"]


async def test_the_deadline_applies_to_a_raw_exchange(tmp_path: Path) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path, sasl_timeout_secs=0.3) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                assert (await handshake_v0(stream, "SCRAM-SHA-256")).error_code == 0
                client = ScramClient("SCRAM-SHA-256", "alice", PASSWORDS["alice"])
                assert await raw(stream, client.first()) is not None
                assert await closed(stream)  # the final message never comes
                counted = failures(server, "kafka", "SCRAM-SHA-256")
    assert counted == 1
    assert "not authenticated within 0.3 s" in events(logs, "sasl_auth_failed")[0]["reason"]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_kafka_python_speaking_to_a_0_11_broker_logs_in(tmp_path: Path,
                                                              mechanism: str) -> None:
    # kafka-python sends SaslHandshake v0 and raw tokens when told the broker is 0.11
    # (SaslHandshake v1 came with Kafka 1.0).
    def script(addr: str, password: str) -> list[Any]:
        common = {"bootstrap_servers": addr, "security_protocol": "SASL_PLAINTEXT",
                  "sasl_mechanism": mechanism, "sasl_plain_username": "alice",
                  "sasl_plain_password": password, "api_version": (0, 11),
                  "request_timeout_ms": 5000}
        producer = kafka.KafkaProducer(acks=1, **common)
        offsets = [producer.send("kp0", value=b"m%d" % i, partition=0).get(5).offset
                   for i in range(3)]
        producer.close(5)
        consumer = kafka.KafkaConsumer(enable_auto_commit=False, consumer_timeout_ms=3000,
                                       **common)
        tp = KTopicPartition("kp0", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = [m.value for _, m in zip(range(3), consumer, strict=False)]
        consumer.close()
        return [offsets, got]

    with capture_logs() as logs:
        async with sasl_server(tmp_path) as server:
            offsets, got = await trio.to_thread.run_sync(script, address(server),
                                                         PASSWORDS["alice"])
    assert offsets == [0, 1, 2] and got == [b"m0", b"m1", b"m2"]
    login = events(logs, "sasl_authenticated")
    assert login and all(e["raw"] and e["mechanism"] == mechanism for e in login)
