"""Refusals of the upstream cluster, end to end: a message too large for it, an unknown
topic the gateway may not create, and the upstream's access policy denying the gateway's
user a write or a read. Each reaches the Figg, Tank and Kafka front ends as that
protocol's error and is counted in ``figtank_upstream_errors{operation,error}``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
import trio

from gateway.client.errors import ProduceFailed, UnknownTopicError
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.bridge.helpers import metric
from tests.serving import ServeProcess
from tests.tls_certs import Certs
from tests.upstream_kafka.helpers import (
    GATEWAY_USER,
    AnyUpstream,
    SecuredUpstream,
    Upstream,
    blocking,
    gateway,
    gateway_config,
    kafka_address,
    kafka_delivery_error,
)

#: The largest bundle the upstream stores in the message-size test.
UPSTREAM_MAX_BUNDLE = 4096


def upstream_errors(served: ServeProcess, operation: str, error: str) -> float:
    """``figtank_upstream_errors_total{operation,error}`` scraped from /metrics."""
    assert served.metrics
    name = f'figtank_upstream_errors_total{{error="{error}",operation="{operation}"}}'
    return metric(served.metrics, name) or 0.0


def _delivery(address: str, topic: str, value: bytes) -> str:
    """The error name of one produce through the gateway ("" when written)."""
    return kafka_delivery_error(address, topic, value, timeout_ms=8000, acks="all",
                                **{"topic.metadata.propagation.max.ms": 500})


def _kafka_fetch_error(address: str, topic: str) -> str:
    """The first error a confluent-kafka consumer assigned to ``topic``/0 reports."""
    consumer = ck.Consumer({"bootstrap.servers": address, "group.id": "unused",
                            "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, 0, 0)])
        for _ in range(50):
            for m in consumer.consume(10, 0.2):
                error = m.error()
                if error is not None and error.name() != "GROUP_AUTHORIZATION_FAILED":
                    return str(error.name())
                if error is None:
                    return "read"
        return "nothing"
    finally:
        consumer.close()


async def _figg_publish_closed(served: ServeProcess, topic: str, value: bytes) -> str:
    """Publish ``value``: the reason the gateway closed the publisher's connection."""
    assert served.figg
    before = len(served.events("connection_closed"))
    async with open_figg_client(*served.figg) as figg:
        await figg.publish(topic, value)
        with trio.fail_after(15):
            while True:
                closed = [e for e in served.events("connection_closed")[before:]
                          if e.get("kind") != "eof"]
                if closed:
                    return str(closed[0]["reason"])
                await trio.sleep(0.05)


async def test_a_message_too_large_for_the_upstream(tmp_path: Path) -> None:
    upstream = Upstream(tmp_path / "up", "--max-bundle-bytes", str(UPSTREAM_MAX_BUNDLE))
    front = gateway(upstream.address)
    # Random: a Tank client's Snappy bundle of it goes up compressed and stays too large.
    large = random.Random(83).randbytes(2 * UPSTREAM_MAX_BUNDLE)
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            served = await front.start()
            assert served.tank
            async with open_tank_client(*served.tank, request_timeout=15) as tank:
                await tank.create_topic("sized", 1)
                with pytest.raises(ProduceFailed) as refused:
                    await tank.produce({("sized", 0): [large]})
                assert refused.value.errors == {("sized", 0): 2}  # Tank's I/O fault
                await tank.produce({("sized", 0): [b"small"]})  # the partition goes on
            assert await blocking(_delivery, kafka_address(served), "sized",
                                  large) == "MSG_SIZE_TOO_LARGE"
            reason = await _figg_publish_closed(served, "sized", large)
            assert "message too large for the upstream" in reason
            assert upstream_errors(served, "produce", "MESSAGE_TOO_LARGE") == 3
            assert [v for _, v in await upstream.stored("sized")] == [b"small"]
    finally:
        front.close()
        upstream.served.close()


async def test_an_unknown_topic_the_gateway_may_not_create(
        tmp_path: Path, upstream: AnyUpstream) -> None:
    config = gateway_config(tmp_path / "gw", settings="[topics]\nauto_create = false\n")
    front = gateway(upstream.address, "--config", str(config))
    try:
        with trio.fail_after(60):
            await upstream.start()
            served = await front.start()
            assert served.tank
            async with open_tank_client(*served.tank, request_timeout=15) as tank:
                with pytest.raises(ProduceFailed) as refused:
                    await tank.produce({("absent", 0): [b"x"]})
                assert refused.value.errors == {("absent", 0): 0xFF}
                with pytest.raises(UnknownTopicError):
                    await tank.consume("absent", 0, 1)
            assert await blocking(_delivery, kafka_address(served), "absent",
                                  b"x") in ("UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC")
            reason = await _figg_publish_closed(served, "absent", b"x")
            assert "unknown topic 'absent'" in reason
            assert upstream_errors(served, "produce", "UNKNOWN_TOPIC_OR_PARTITION") == 2
            assert upstream_errors(served, "fetch", "UNKNOWN_TOPIC_OR_PARTITION") == 1
            assert upstream_errors(served, "metadata", "UNKNOWN_TOPIC_OR_PARTITION") >= 1
            # Nothing was created upstream.
            assert await upstream.partitions("absent") == 0
    finally:
        front.close()
        upstream.close()


#: The upstream's policy: the gateway's user may read ``readonly`` but not write it, and
#: write ``writeonly`` but not read it.
DENYING_RULES = f"""
[[rule]]
who = ["user:{GATEWAY_USER}"]
topics = ["readonly"]
allow = ["subscribe"]
deny = ["publish"]

[[rule]]
who = ["user:{GATEWAY_USER}"]
topics = ["writeonly"]
allow = ["publish"]
deny = ["subscribe"]
"""


async def test_the_upstream_denies_the_gateway_a_write_and_a_read(
        tmp_path: Path, certs: Certs) -> None:
    upstream = SecuredUpstream(tmp_path / "up", certs, rules=DENYING_RULES)
    config = gateway_config(tmp_path / "gw", certs=certs, mechanism="SCRAM-SHA-256")
    front = gateway(upstream.address, "--config", str(config))
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            async with open_tank_client("127.0.0.1", upstream.tank_port) as direct:
                await direct.produce({("readonly", 0): [b"r1"], ("writeonly", 0): [b"w1"]})
            served = await front.start()
            assert served.tank
            async with open_tank_client(*served.tank, request_timeout=15) as tank:
                # Write denied: Tank's read-only code.
                with pytest.raises(ProduceFailed) as refused:
                    await tank.produce({("readonly", 0): [b"x"]})
                assert refused.value.errors == {("readonly", 0): 0xFE}
                assert [m.value for m in (await tank.consume("readonly", 0, 1)).messages] == [
                    b"r1"]
                # Read denied: hidden, as figtank's own policy hides what one may not read.
                with pytest.raises(UnknownTopicError):
                    await tank.consume("writeonly", 0, 1)
            address = kafka_address(served)
            assert await blocking(_delivery, address, "readonly",
                                  b"x") == "TOPIC_AUTHORIZATION_FAILED"
            assert await blocking(_kafka_fetch_error, address,
                                  "writeonly") == "TOPIC_AUTHORIZATION_FAILED"
            assert await blocking(_kafka_fetch_error, address, "readonly") == "read"
            reason = await _figg_publish_closed(served, "readonly", b"x")
            assert "upstream authorization failed" in reason
            closed = await _figg_attach_refused(served, "writeonly")
            assert closed["kind"] == "subscription_failed" and "denied" in closed["reason"]
            assert upstream_errors(served, "produce", "TOPIC_AUTHORIZATION_FAILED") == 3
            assert upstream_errors(served, "fetch", "TOPIC_AUTHORIZATION_FAILED") >= 3
            assert [v for _, v in await upstream.stored("readonly")] == [b"r1"]
    finally:
        front.close()
        upstream.served.close()


async def _figg_attach_refused(served: ServeProcess, topic: str) -> Any:
    """ATTACH ``topic`` from offset 0: the line of the connection the gateway closed."""
    assert served.figg
    before = len(served.events("connection_closed"))
    async with open_figg_client(*served.figg) as figg:
        await figg.subscribe(topic, from_offset=0)
        with trio.fail_after(15):
            while True:
                closed = [e for e in served.events("connection_closed")[before:]
                          if e.get("kind") != "eof"]
                if closed:
                    return closed[0]
                await trio.sleep(0.05)
