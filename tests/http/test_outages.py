"""Upstream outages on the HTTP front ends (:mod:`tests.http.outage_helpers`), over a bridge
in front of a Tank broker (both in-process; the broker stopped and started again on its
port, with its data) and over a gateway in upstream-Kafka mode (real processes; the
upstream killed and restarted). ``upstream.wait_secs`` is 1 s here, as a deployment that
wants short waits sets it."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.http.outage_helpers import bridge_over_a_restartable_broker, outage
from tests.upstream_kafka.helpers import Upstream, gateway


async def test_an_outage_of_the_tank_broker_behind_a_bridge(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with bridge_over_a_restartable_broker(tmp_path / "up") as (bridge, broker):
            assert bridge.tank is not None
            figures = await outage(*bridge.http, broker.stop, broker.start, bridge.tank)
            print(figures)
            assert figures.produce < 1.0 and figures.fetch < 1.0 and figures.ws_publish < 1.0


async def test_an_outage_of_the_upstream_kafka_cluster(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("[upstream]\nwait_secs = 1.0\n")
    upstream = Upstream(tmp_path / "up")
    front = gateway(upstream.address, "--http-listen", "127.0.0.1:0",
                    "--config", str(config))
    try:
        with trio.fail_after(90):
            await upstream.served.start()
            served = await front.start()
            assert served.http is not None and served.tank is not None
            figures = await outage(*served.http, upstream.served.kill,
                                   upstream.served.start, served.tank)
            print(figures)
            assert figures.produce < 1.0 and figures.fetch < 1.0 and figures.ws_publish < 1.0
            assert not [e for e in served.log_lines if "Traceback" in str(e)]
            assert not [e for e in served.log_lines if e.get("event") == "session_crashed"]
    finally:
        front.close()
        upstream.served.close()
