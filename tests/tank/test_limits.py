"""Creation within limits (issue 15, item 7, and client-set topic config within bounds):
``limits.max_topics``, ``limits.max_partitions``, the minimums of CreateTopic's config, and
the descriptor gauges, over a Tank listener on loopback."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.client.errors import ProduceFailed, RequestFailed, UnknownTopicError
from gateway.client.tank import open_tank_client
from tests.tank.helpers import tank_server


def limit_hits(server, limit: str) -> float | None:
    return server.metric(f'figtank_limit_hits_total{{limit="{limit}"}}')


async def test_auto_creation_past_max_topics_is_refused(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data", max_topics=20) as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        for i in range(20):
            await client.produce({(f"t{i}", 0): [b"x"]})
        assert server.metric("figtank_topics") == 20
        with capture_logs() as logs, pytest.raises(ProduceFailed) as caught:
            await client.produce({("t20", 0): [b"x"]})
        assert "code 255" in str(caught.value)  # as an unknown topic
        with pytest.raises(UnknownTopicError):
            await client.discover_partitions("t20")
        [line] = [e for e in logs if e["event"] == "topic_limit_reached"]
        assert line["log_level"] == "warning" and line["limit"] == "max_topics"
        assert limit_hits(server, "max_topics") == 1
        assert not (tmp_path / "data" / "t20").exists()
        await client.produce({("t3", 0): [b"y"]})  # the others are served on
        assert server.metric("figtank_topics") == 20


async def test_create_topic_over_max_partitions_is_refused_at_once(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data") as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        started = time.perf_counter()
        with capture_logs() as logs, pytest.raises(RequestFailed) as caught:
            await client.create_topic("huge", 65_530)  # the default limit: 20,000
        assert time.perf_counter() - started < 0.5
        assert caught.value.code == 2  # system error
        assert [e["limit"] for e in logs if e["event"] == "topic_limit_reached"] == [
            "max_partitions"]
        assert limit_hits(server, "max_partitions") == 1
        assert os.listdir(tmp_path / "data") == []  # nothing built, nothing left behind
        await client.create_topic("fine", 4)
        assert server.metric("figtank_partitions") == 4


async def test_partitions_of_all_topics_count_together(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data", max_partitions=10) as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        await client.create_topic("a", 6)
        with pytest.raises(RequestFailed) as caught:
            await client.create_topic("b", 5)
        assert caught.value.code == 2
        await client.create_topic("b", 4)
        assert server.metric("figtank_partitions") == 10
        assert sorted(os.listdir(tmp_path / "data")) == ["a", "b"]


@pytest.mark.parametrize(("key", "value", "minimum"), [
    ("log.segment.bytes", "64", "65536"),
    ("log.segment.bytes", "64000", "65536"),
    ("log.index.size.max.bytes", "1024", "4096"),
    ("log.roll.secs", "10", "60"),
])
async def test_create_topic_config_below_the_minimum_is_refused(
        tmp_path: Path, key: str, value: str, minimum: str) -> None:
    async with tank_server(tmp_path / "data") as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        with capture_logs() as logs, pytest.raises(RequestFailed) as caught:
            await client.create_topic("small", 1, {key: value})
        assert caught.value.code == 4  # bad config
        [line] = [e for e in logs if e["event"] == "create_topic_bad_config"]
        assert key in line["error"] and minimum in line["error"]
        assert not (tmp_path / "data" / "small").exists()
        await client.create_topic("small", 1, {key: minimum})  # the minimum itself is fine


async def test_auto_created_topics_take_config_within_bounds(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data", topic_config={"log.segment.bytes": "64kb"}
                           ) as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        await client.produce({("auto", 0): [b"x"]})
        topic = server.backend.store.topic("auto")
        assert topic.partitions[0].config.segment_bytes == 64 * 1024


async def test_reload_conf_refuses_a_config_file_below_the_minimum(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data") as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        await client.create_topic("rc", 1)
        (tmp_path / "data" / "rc" / "0" / "config").write_text("log.segment.bytes=64\n")
        with capture_logs() as logs, pytest.raises(RequestFailed) as caught:
            await client.reload_conf("rc", 0)
        assert caught.value.code == 3  # parse error: the partition keeps its config
        assert any("log.segment.bytes" in e.get("error", "") for e in logs)
        assert server.backend.store.partition("rc", 0).config.segment_bytes == 1 << 30


async def test_descriptor_gauges(tmp_path: Path) -> None:
    async with tank_server(tmp_path / "data") as server:
        opened = server.metric("figtank_open_descriptors")
        limit = server.metric("figtank_descriptor_limit")
        assert opened is not None and 0 < opened < limit
        assert server.metric("figtank_open_segment_files") == 0
