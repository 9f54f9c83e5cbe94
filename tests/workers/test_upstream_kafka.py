"""Two workers in upstream-Kafka mode over a ``figtank serve`` Kafka listener: each worker
has its own connection to the upstream; what is published through either is read
through either."""

from __future__ import annotations

from pathlib import Path

import trio

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.workers.helpers import samples, scrape, total, upstream_and_gateway, wait_for


async def test_publish_and_read_through_both_workers(tmp_path: Path) -> None:
    producers, per_producer = 10, 4
    async with upstream_and_gateway(tmp_path, "upstream-kafka") as (upstream, _, served):
        assert served.tank and served.figg
        assert served.events("figtank_serving")[-1]["backend"] == "upstream_kafka"
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for p in range(producers):
                    async def produce(p: int = p) -> None:
                        async with open_tank_client(*served.tank, request_timeout=20) as tank:
                            for i in range(per_producer):
                                await tank.produce({("uk", 0): [b"p%02d-%d" % (p, i)]})
                    nursery.start_soon(produce)
            for i in range(4):  # Figg publishers, on whichever worker
                async with open_figg_client(*served.figg) as figg:
                    await figg.publish_and_wait("uk", b"figg-%d" % i)
            stored = await upstream.stored("uk")
            assert len(stored) == producers * per_producer + 4
            for _ in range(6):
                async with open_tank_client(*served.tank, request_timeout=20) as tank:
                    result = await tank.consume("uk", 0, 1, fetch_size=1024 * 1024)
                    assert [m.value for m in result.messages] == stored

            def counted() -> bool:
                text = scrape(served)[1]
                return total(text, "figtank_requests_total", protocol="tank", type="produce",
                             result="ok") == producers * per_producer

            await wait_for(counted)
        text = scrape(served)[1]
        tank_accepted = [value for labels, value in
                         samples(text, "figtank_worker_connections_accepted_total")
                         if labels["listener"] == "tank"]
        assert sum(tank_accepted) == producers + 6 and min(tank_accepted) > 0
        assert total(text, "figtank_upstream_up") == 1
        assert scrape(served, "/health") == (200, "ready\n")
