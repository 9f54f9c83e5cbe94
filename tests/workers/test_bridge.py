"""Two workers in bridge mode over a ``figtank serve`` upstream: every listener served by
both, one metrics endpoint that adds them up, one log stream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from kafka import KafkaConsumer
from kafka.errors import GroupAuthorizationFailedError

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from gateway.kafka.services import NO_GROUPS_WORKERS
from tests.workers.helpers import samples, scrape, total, upstream_and_gateway, wait_for

LISTENERS = ("tank", "figg", "kafka", "http")
CONNECTIONS = 24


async def test_connections_spread_over_both_workers_on_every_listener(tmp_path: Path) -> None:
    async with upstream_and_gateway(tmp_path) as (_, _, served):
        pids = served.events("figtank_serving")[-1]["pids"]
        assert len(pids) == 2 and len(set(pids)) == 2
        streams = []
        with trio.fail_after(30):
            for name in LISTENERS:
                host, port = getattr(served, name)
                for _ in range(CONNECTIONS):
                    streams.append(await trio.open_tcp_stream(host, port))

            def all_counted() -> bool:
                text = scrape(served)[1]
                return all(total(text, "figtank_worker_connections_accepted_total",
                                 listener=name) == CONNECTIONS for name in LISTENERS)

            await wait_for(all_counted)
        text = scrape(served)[1]
        for name in LISTENERS:
            # The kernel hashed them over both (all 24 on one: a chance of 2**-23).
            per_worker = {labels["pid"]: value for labels, value in
                          samples(text, "figtank_worker_connections_accepted_total")
                          if labels["listener"] == name}
            assert set(per_worker) == {str(pid) for pid in pids}, (name, per_worker)
            assert all(value > 0 for value in per_worker.values()), (name, per_worker)
            # The gateway's own series is the workers' sum.
            assert total(text, "figtank_connections_accepted_total",
                         listener=name) == CONNECTIONS
        for stream in streams:
            await stream.aclose()


async def test_publish_and_consume_through_both_workers(tmp_path: Path) -> None:
    producers, per_producer = 12, 5
    async with upstream_and_gateway(tmp_path) as (upstream, _, served):
        assert served.tank and served.figg
        with trio.fail_after(40):
            async with trio.open_nursery() as nursery:
                for p in range(producers):
                    async def produce(p: int = p) -> None:
                        async with open_tank_client(*served.tank, request_timeout=10) as tank:
                            for i in range(per_producer):
                                await tank.produce({("spread", 0): [b"p%02d-%d" % (p, i)]})
                    nursery.start_soon(produce)
            async with open_figg_client(*served.figg) as figg:
                await figg.publish_and_wait("spread", b"figg")
            expected = producers * per_producer + 1
            stored = await upstream.stored("spread")
            assert len(stored) == expected
            assert b"figg" in stored
            # Each of several consumers (on whichever worker) reads the whole log.
            for _ in range(6):
                async with open_tank_client(*served.tank, request_timeout=10) as tank:
                    result = await tank.consume("spread", 0, 1, fetch_size=1024 * 1024)
                    assert [m.value for m in result.messages] == stored

            def produces_counted() -> bool:
                return total(scrape(served)[1], "figtank_requests_total", protocol="tank",
                             type="produce", result="ok") == producers * per_producer

            await wait_for(produces_counted)
        text = scrape(served)[1]
        accepted = {labels["pid"]: value for labels, value in
                    samples(text, "figtank_worker_connections_accepted_total")
                    if labels["listener"] == "tank"}
        assert sum(accepted.values()) == producers + 6
        assert len(accepted) == 2 and min(accepted.values()) > 0, accepted
        assert total(text, "figtank_upstream_up") == 1  # the smallest, not the sum
        assert scrape(served, "/health") == (200, "ready\n")


async def test_one_log_stream_with_the_worker_field(tmp_path: Path) -> None:
    async with upstream_and_gateway(tmp_path) as (_, front, served):
        pids = served.events("figtank_serving")[-1]["pids"]
        assert await front.stop() == 0
    serving = served.events("worker_serving")
    assert sorted(line["worker"] for line in serving) == [0, 1]
    assert sorted(line["pid"] for line in serving) == sorted(pids)
    # Every worker line is whole JSON (none cut into another) and says whose it is.
    assert not [line for line in served.log_lines if "raw" in line]
    stopped = [line for line in served.events("figtank_stopped") if "worker" in line
               and "workers" not in line]
    assert sorted(line["worker"] for line in stopped) == [0, 1]


def _group_refused(address: str) -> str:
    consumer = KafkaConsumer("grouped", bootstrap_servers=address, group_id="shared",
                             consumer_timeout_ms=5000)
    try:
        with pytest.raises(GroupAuthorizationFailedError) as refused:
            consumer.poll(timeout_ms=5000)
            consumer.poll(timeout_ms=5000)
        return str(refused.value)
    finally:
        consumer.close()


async def test_kafka_consumer_groups_are_refused(tmp_path: Path) -> None:
    # Each worker would coordinate groups of its own: members on two workers would
    # each be given every partition.
    async with upstream_and_gateway(tmp_path) as (_, _, served):
        assert served.kafka
        address = f"{served.kafka[0]}:{served.kafka[1]}"
        message = await trio.to_thread.run_sync(_group_refused, address)
        assert "GroupAuthorizationFailed" in message
        refused = served.events("kafka_groups_not_served")
        assert refused and refused[0]["reason"] == NO_GROUPS_WORKERS


def test_an_offsets_file_is_refused_with_workers(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--workers", "2", "--upstream",
         "127.0.0.1:9", "--offsets-file", str(tmp_path / "offsets.log")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("figtank: configuration error: offsets.file: a gateway "
                                    "of several workers keeps no committed offsets")
