"""The store's creation limits (issue 15, item 7) and the minimums of client-set config."""

from __future__ import annotations

import os

import pytest
from structlog.testing import capture_logs

from gateway.store import (
    NO_BOUNDS,
    ConfigBounds,
    InvalidConfig,
    LimitReached,
    StoreSettings,
    TopicConfig,
    open_store,
)
from gateway.store.descriptors import (
    BASE_RESERVE,
    DescriptorBudget,
    count_partitions,
    descriptor_limits,
    open_descriptors,
)
from tests.docs import DOCS


def settings(**kw: object) -> StoreSettings:
    return StoreSettings(maintenance_interval=float("inf"), **kw)  # type: ignore[arg-type]


async def test_topic_and_partition_limits(tmp_path):
    async with open_store(tmp_path, settings(max_topics=3, max_partitions=5),
                          maintenance=False) as store:
        await store.create_topic("a", 2)
        await store.create_topic("b", 2)
        with pytest.raises(LimitReached) as caught:
            await store.create_topic("c", 2)
        assert caught.value.limit == "max_partitions" and "limits.max_partitions=5" in str(
            caught.value)
        await store.create_topic("c", 1)
        with pytest.raises(LimitReached) as caught:
            await store.create_topic("d", 1)
        assert caught.value.limit == "max_topics"
        assert (store.topic_count, store.partition_count) == (3, 5)
        assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]
    # Reopened: what the data directory holds counts.
    async with open_store(tmp_path, settings(max_topics=3, max_partitions=5),
                          maintenance=False) as store:
        assert (store.topic_count, store.partition_count) == (3, 5)
        with pytest.raises(LimitReached):
            await store.create_topic("d", 1)
    assert count_partitions(tmp_path) == 5


async def test_a_creation_that_would_leave_too_few_descriptors_is_refused(tmp_path):
    soft = descriptor_limits()[0]
    opened = open_descriptors()
    assert opened is not None
    async with open_store(tmp_path, settings(descriptor_reserve=1), maintenance=False) as s:
        s._descriptors.reserve = soft - (open_descriptors() or 0) - 4  # room for 2 partitions
        await s.create_topic("fits", 2)
        with pytest.raises(LimitReached) as caught:
            await s.create_topic("more", 1)
        assert caught.value.limit == "open_files"
        assert "descriptors" in str(caught.value)
        assert s.topics() == ["fits"]


def test_descriptor_budget_keeps_the_reserve():
    soft = descriptor_limits()[0]
    opened = open_descriptors() or 0
    budget = DescriptorBudget(reserve=soft - opened - 10)
    assert budget.room_for(5, lambda: 0)[0]  # 10 descriptors
    assert not budget.room_for(1, lambda: 5)[0]  # the 5 partitions did not open theirs yet
    budget = DescriptorBudget(reserve=soft - opened - 10)
    assert not budget.room_for(1, lambda: 5)[0]  # 5 partitions will open theirs
    assert DescriptorBudget(reserve=0).room_for(10**9, lambda: 0)[0]


def test_config_bounds_name_the_key_and_the_minimum():
    with pytest.raises(InvalidConfig, match=r"log.segment.bytes=64 is below the minimum 65536"):
        TopicConfig().with_text("log.segment.bytes=64", ConfigBounds())
    with pytest.raises(InvalidConfig, match=r"log.roll.secs=1 is below the minimum 60"):
        TopicConfig().with_text("log.roll.secs=1", ConfigBounds())
    with pytest.raises(InvalidConfig, match=r"log.index.size.max.bytes"):
        TopicConfig().with_keys({"log.index.size.max.bytes": "1kb"}, ConfigBounds())
    ok = TopicConfig().with_text("log.segment.bytes=64kb\nlog.retention.secs=0\n"
                                 "flush.messages=0\nlog.roll.secs=1min", ConfigBounds())
    assert (ok.segment_bytes, ok.roll_secs) == (65536, 60)
    assert TopicConfig().with_text("log.segment.bytes=64", NO_BOUNDS).segment_bytes == 64
    assert TopicConfig(segment_bytes=100).segment_bytes == 100  # built directly: not bound


async def test_create_topic_and_config_files_are_bound(tmp_path):
    async with open_store(tmp_path, settings(), maintenance=False) as store:
        with pytest.raises(InvalidConfig, match=r"log\.segment\.bytes"):
            await store.create_topic("t", 1, "log.segment.bytes=4096")
        assert os.listdir(tmp_path) == []
        await store.create_topic("t", 1)
        (tmp_path / "t" / "config").write_text("log.segment.bytes=100\n")
        with pytest.raises(InvalidConfig):
            await store.reload_config("t", 0)
        assert store.partition("t", 0).config.segment_bytes == 1 << 30
    # At start-up, a config file on disk keeps its good keys (its retention above all): a
    # value below its minimum is raised to it, a line that does not parse is left out.
    (tmp_path / "t" / "config").write_text(
        "log.segment.bytes=100\nlog.retention.secs=3600\nnonsense\n")
    with capture_logs() as logs:
        async with open_store(tmp_path, settings(), maintenance=False) as store:
            config = store.partition("t", 0).config
            assert (config.segment_bytes, config.retention_secs) == (64 * 1024, 3600)
    [line] = [e for e in logs if e["event"] == "config_partly_ignored"]
    assert line["raised_to_minimum"] == ["log.segment.bytes=100 -> 65536"]
    assert line["ignored"] == ["config line 3: expected key=value, got 'nonsense'"]


def test_base_reserve_is_documented():
    limits = (DOCS / "limits.md").read_text()
    assert f"`2 x partitions + {BASE_RESERVE}`" in limits
