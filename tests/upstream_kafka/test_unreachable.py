"""Upstream unreachable at start: the gateway serves, is not ready, each protocol answers
"unavailable" (no hang, no traceback), and it is ready once the upstream answers; one log
line per change of state."""

from __future__ import annotations

import trio

from gateway.client.errors import ProduceFailed
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.bridge.helpers import metric
from tests.test_health import wait_for_health
from tests.upstream_kafka.helpers import (
    AnyUpstream,
    blocking,
    gateway,
    kafka_address,
    kafka_delivery_error,
)


async def test_unreachable_upstream_then_it_comes(upstream: AnyUpstream) -> None:
    front = gateway(upstream.address)
    try:
        with trio.fail_after(90):
            served = await front.start()  # nothing answers at the upstream's address
            assert served.metrics and served.tank and served.figg
            status, body = await blocking(wait_for_health, served.metrics, 503, 1)
            assert status == 503 and body.startswith(
                f"upstream unreachable: {upstream.address}")
            assert metric(served.metrics, "figtank_upstream_up") == 0
            # Tank: a produce is refused at once (I/O fault), not held.
            async with open_tank_client(*served.tank, request_timeout=10) as tank:
                started = trio.current_time()
                try:
                    await tank.produce({("later", 0): [b"x"]})
                except ProduceFailed as exc:
                    refused = str(exc)
                else:
                    raise AssertionError("a produce with no upstream was acknowledged")
                assert trio.current_time() - started < 8
            assert "later" in refused
            # Kafka: the delivery fails with the listener's storage error, in time.
            assert await blocking(kafka_delivery_error, kafka_address(served), "later") in (
                "KAFKA_STORAGE_ERROR", "_MSG_TIMED_OUT")
            # Figg has no NACK: the gateway closes the publisher's connection and says why.
            async with open_figg_client(*served.figg) as figg:
                await figg.publish("later", b"x")
                with trio.fail_after(15):
                    while not any("upstream unreachable" in str(e.get("reason", ""))
                                  for e in served.events("connection_closed")):
                        await trio.sleep(0.05)
            # The upstream comes: ready, and everything works.
            await upstream.start()
            status, body = await blocking(wait_for_health, served.metrics, 200, 20)
            assert (status, body) == (200, "ready\n")
            async with open_figg_client(*served.figg) as figg:
                await figg.publish_and_wait("later", b"now")
            assert [v for _, v in await upstream.stored("later")][-1:] == [b"now"]
            states = [e["event"] for e in served.log_lines
                      if e.get("event") in ("upstream_down", "upstream_up")]
            assert states == ["upstream_down", "upstream_up"]
            assert not [e for e in served.log_lines if "Traceback" in str(e)]
            assert await front.stop() == 0
    finally:
        front.close()
        upstream.close()
