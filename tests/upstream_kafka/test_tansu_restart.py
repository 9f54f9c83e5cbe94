"""Tansu restarted under a gateway: its in-memory store, and with it every producer id it
issued, is gone (Tansu then answers UNKNOWN_PRODUCER_ID to any producer id it did not issue
since, even at sequence 0 of a new epoch). The gateway must get a fresh producer id by
itself, and ``/health`` must not say ready while no publish can succeed (issue 35,
"Recovery").

The SIGKILL test that keeps the data (test_upstream_restart.py) needs an upstream that
stores to disk: it runs against the figtank stand-in only."""

from __future__ import annotations

import time

import pytest
import trio

from gateway.client.errors import ClientError
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.serving import ServeProcess
from tests.tansu import TansuUpstream
from tests.test_serve import http_get
from tests.upstream_kafka.helpers import blocking, gateway

#: Seconds after Tansu is back within which a publish through the gateway must succeed
#: (the gateway's producer gives up on a message after 10 s; a recovery needs far less).
RECOVERY_BOUND = 20.0
#: How long one probe's Tank produce may take before it counts as failed.
PROBE_TIMEOUT = 12.0


async def _probe(served: ServeProcess, n: int) -> tuple[int, bool, float]:
    """Ask ``/health``, then produce one message through the Tank listener:
    ``(health status, whether the produce was acknowledged, its seconds)``."""
    assert served.metrics and served.tank
    status, _ = await blocking(http_get, served.metrics, "/health")
    started = time.monotonic()
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            async with open_tank_client(*served.tank, request_timeout=PROBE_TIMEOUT) as tank:
                await tank.produce({("after", 0): [b"probe-%03d" % n]})
    except (ClientError, trio.TooSlowError, OSError):
        return status, False, time.monotonic() - started
    return status, True, time.monotonic() - started


@pytest.mark.slow
async def test_the_gateway_recovers_when_tansu_loses_its_producer_ids(
        tansu: TansuUpstream) -> None:
    front = gateway(tansu.address)
    try:
        with trio.fail_after(150):
            served = await front.start()
            assert served.figg and served.tank and served.metrics
            await tansu.create_topic("before", 1)
            async with open_figg_client(*served.figg) as figg:
                for i in range(20):
                    await figg.publish_and_wait("before", b"before-%02d" % i)
            assert len(await tansu.stored("before")) == 20
            assert (await blocking(http_get, served.metrics, "/health"))[0] == 200

            # Tansu restarts empty: no topic, no producer id. The operator makes the
            # topic again (the gateway's own auto-creation is not what is tested here).
            await tansu.kill()
            await tansu.start()
            await tansu.create_topic("after", 1)
            back_at = time.monotonic()

            probes: list[tuple[float, int, bool, float]] = []
            n = 0
            while time.monotonic() - back_at < RECOVERY_BOUND + PROBE_TIMEOUT:
                status, ok, seconds = await _probe(served, n)
                probes.append((time.monotonic() - back_at, status, ok, seconds))
                n += 1
                if ok and len([p for p in probes if p[2]]) >= 3:
                    break
                await trio.sleep(0.2)
            acknowledged = [p for p in probes if p[2]]
            stored = [v for _, v in await tansu.stored("after")]
            # A Figg publisher after the recovery, too.
            figg_ok = False
            if acknowledged:
                async with open_figg_client(*served.figg) as figg:
                    with trio.move_on_after(PROBE_TIMEOUT):
                        await figg.publish_and_wait("after", b"figg-after")
                        figg_ok = True
            log = [line for line in served.log_lines if "producer" in str(line.get("event"))
                   or "upstream" in str(line.get("event"))]
    finally:
        front.close()
    report = "; ".join(f"{at:.1f}s health {status} {'ok' if ok else 'failed'} in {took:.1f}s"
                       for at, status, ok, took in probes)
    print(f"after the restart: {report}\ngateway log: {log[-10:]}")
    # It got a fresh producer id by itself: publishes succeed again, in bounded time.
    assert acknowledged, f"no publish succeeded within {RECOVERY_BOUND} s: {report}"
    assert acknowledged[0][0] - acknowledged[0][3] < RECOVERY_BOUND, report
    assert figg_ok, "a Figg publish after the recovery was not acknowledged"
    # /health never said ready while a publish failed.
    lied = [p for p in probes if p[1] == 200 and not p[2]]
    assert not lied, f"/health said ready while publishes failed: {report}"
    # Every acknowledged probe is stored, once.
    for i, (_, _, ok, _) in enumerate(probes):
        if ok:
            assert stored.count(b"probe-%03d" % i) == 1, (i, stored)
