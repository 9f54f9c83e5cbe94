"""TLS and SASL to the upstream, end to end: the upstream's Kafka listener requires TLS
with a client certificate and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); a gateway
configured with ``[upstream_kafka]`` tls_ca, tls_cert, tls_key and sasl_* serves Figg,
Tank and Kafka clients from it. Wrong credentials: not ready, one clear log line, each
front end's "unavailable" answer, no hang."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka as ck
import pytest
import trio

from gateway.client.errors import ProduceFailed
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.bridge.helpers import metric
from tests.serving import Served
from tests.test_health import wait_for_health
from tests.tls_certs import Certs
from tests.upstream_kafka.helpers import (
    MECHANISMS,
    SecuredUpstream,
    blocking,
    gateway,
    gateway_config,
    kafka_address,
    kafka_delivery_error,
)


def _kafka_produce_consume(address: str, topic: str, values: list[bytes]
                           ) -> tuple[list[int], list[tuple[int, bytes]]]:
    """Produce ``values`` to partition 0 through the gateway, then read them back."""
    producer = ck.Producer({"bootstrap.servers": address, "acks": "all",
                            "enable.idempotence": True})
    offsets: list[int] = []
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=lambda err, msg: offsets.append(
            -1 if err else msg.offset()))
    assert producer.flush(15) == 0
    consumer = ck.Consumer({"bootstrap.servers": address, "group.id": "unused",
                            "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes]] = []
        for _ in range(100):
            got += [(m.offset(), m.value()) for m in consumer.consume(10, 0.2)
                    if not m.error()]
            if len(got) >= len(values):
                break
        return offsets, got
    finally:
        consumer.close()


def _secured_gateway(tmp_path: Path, certs: Certs, upstream: SecuredUpstream,
                     mechanism: str, password: str | None = None) -> Served:
    client_cert = f'tls_cert = "{certs.client_cert}"\ntls_key = "{certs.client_key}"\n'
    config = gateway_config(tmp_path / "gw", certs=certs, mechanism=mechanism,
                            **({"password": password} if password else {}),
                            settings=client_cert)
    return gateway(upstream.address, "--config", str(config))


def _secured_upstream(tmp_path: Path, certs: Certs) -> SecuredUpstream:
    """Mutual TLS (the test CA's client certificates) and SASL on its Kafka listener."""
    return SecuredUpstream(tmp_path / "up", certs, listener=f'tls_client_ca = "{certs.ca_pem}"\n')


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_figg_tank_and_kafka_clients_through_tls_and_sasl(
        tmp_path: Path, certs: Certs, mechanism: str) -> None:
    upstream = _secured_upstream(tmp_path, certs)
    front = _secured_gateway(tmp_path, certs, upstream, mechanism)
    try:
        with trio.fail_after(60):
            up = await upstream.served.start()
            served = await front.start()
            assert served.figg and served.tank and served.metrics
            # Figg: publishes acknowledged after the upstream stored them; attach reads them.
            async with open_figg_client(*served.figg) as figg:
                for i in range(5):
                    await figg.publish_and_wait("figg", b"f%d" % i)
                sub = await figg.subscribe("figg", from_offset=0)
                got = [(m.offset, m.data) for m in [await sub.receive() for _ in range(5)]]
            assert got == [(i + 1, b"f%d" % i) for i in range(5)]
            # Tank: produce and consume.
            async with open_tank_client(*served.tank, request_timeout=10) as tank:
                await tank.produce({("tank", 0): [b"t0", b"t1", b"t2"]})
                result = await tank.consume("tank", 0, 1)
            assert [(m.seq, m.value) for m in result.messages] == [
                (1, b"t0"), (2, b"t1"), (3, b"t2")]
            # Kafka: confluent-kafka produces and fetches through the gateway.
            values = [b"k%d" % i for i in range(4)]
            offsets, read = await blocking(_kafka_produce_consume, kafka_address(served),
                                           "kafka", values)
            assert offsets == [0, 1, 2, 3]
            assert read == list(enumerate(values))
            # All of it is upstream, written by the gateway's SASL user over TLS.
            assert [v for _, v in await upstream.stored("figg")] == [b"f%d" % i
                                                                      for i in range(5)]
            assert [v for _, v in await upstream.stored("kafka")] == values
            logins = up.events("sasl_authenticated")
            assert logins and {(e["user"], e["mechanism"]) for e in logins} == {
                ("gateway", mechanism)}
            assert not up.events("sasl_auth_failed")
            assert served.events("upstream_down") == []
            assert served.events("upstream_client_fatal") == []
            # Closed by the clients (eof; or reset, or a send that failed: librdkafka closing
            # a connection with a response still unread or on its way), never by the gateway.
            assert [e for e in served.events("connection_closed")
                    if e.get("kind") not in ("eof", "reset", "send_failed")] == []
    finally:
        front.close()
        upstream.served.close()


async def test_wrong_password_is_not_ready_and_each_front_end_says_unavailable(
        tmp_path: Path, certs: Certs) -> None:
    upstream = _secured_upstream(tmp_path, certs)
    front = _secured_gateway(tmp_path, certs, upstream, "SCRAM-SHA-512", password="wrong")
    try:
        with trio.fail_after(60):
            up = await upstream.served.start()
            served = await front.start()
            assert served.figg and served.tank and served.metrics
            # One clear line: the upstream refused the gateway's credentials.
            with trio.fail_after(15):
                while not served.events("upstream_authentication_failed"):
                    await trio.sleep(0.05)
            [refused] = served.events("upstream_authentication_failed")
            assert "SASL authentication" in refused["reason"], refused
            status, body = await blocking(wait_for_health, served.metrics, 503, 1)
            assert status == 503 and body.startswith(f"upstream unreachable: {upstream.address}")
            assert "SASL authentication" in body
            # The upstream's log says why; the gateway was only told "invalid credentials".
            assert "wrong password for user 'gateway'" in up.events("sasl_auth_failed")[0][
                "reason"]
            assert "wrong password" not in refused["reason"]
            kafka: list[str] = []

            async def tank_refused() -> None:
                assert served.tank
                async with open_tank_client(*served.tank, request_timeout=10) as tank:
                    with pytest.raises(ProduceFailed):
                        await tank.produce({("tank", 0): [b"x"]})

            async def kafka_refused() -> None:
                kafka.append(await blocking(kafka_delivery_error, kafka_address(served), "kafka"))

            async def figg_closed() -> None:
                assert served.figg
                async with open_figg_client(*served.figg) as figg:
                    await figg.publish("figg", b"x")
                    with trio.fail_after(15):
                        while not any("upstream unreachable" in str(e.get("reason", ""))
                                      for e in served.events("connection_closed")):
                            await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:  # the three front ends at once
                for ask in (tank_refused, kafka_refused, figg_closed):
                    nursery.start_soon(ask)
            assert kafka[0] in ("KAFKA_STORAGE_ERROR", "_MSG_TIMED_OUT")
            assert metric(served.metrics, "figtank_upstream_up") == 0
            # One line each, not one per retry.
            assert len(served.events("upstream_down")) == 1
            assert len(served.events("upstream_authentication_failed")) == 1
            assert not [e for e in served.log_lines if "Traceback" in str(e)]
    finally:
        front.close()
        upstream.served.close()


