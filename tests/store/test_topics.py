"""Topic names, config files and topic creation."""

from __future__ import annotations

import pytest
import trio

import gateway.store.store as store_module
from gateway.store import (
    MAX_PARTITIONS,
    InvalidConfig,
    InvalidTopicName,
    StoreError,
    TopicConfig,
    TopicExists,
    is_valid_topic_name,
    parse_config,
    validate_topic_name,
)
from gateway.store.config import parse_duration, parse_size
from tests.store.helpers import bundle, store_at


@pytest.mark.parametrize("name", ["a", "A9", "orders", "a-b_c", "x" * 64, "1", "a_-b"])
def test_valid_topic_names(name):
    assert is_valid_topic_name(name)
    assert validate_topic_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "-a", "a-", "_a", "a_", "a/b", "..", ".a",
                                  "a b", "é", "a.b", "../etc", "a\x00"])
def test_invalid_topic_names(name):
    assert not is_valid_topic_name(name)
    with pytest.raises(InvalidTopicName):
        validate_topic_name(name)


def test_a_name_that_is_not_a_string_or_too_long_is_refused_and_not_remembered():
    from protocols import topics
    before = topics._valid_name.cache_info().currsize
    assert not is_valid_topic_name(b"orders")  # type: ignore[arg-type]
    assert not is_valid_topic_name(None)  # type: ignore[arg-type]
    assert not is_valid_topic_name("y" * 1_000_000)
    assert topics._valid_name.cache_info().currsize == before


def test_sizes_and_durations():
    assert parse_size("4096") == 4096
    assert parse_size("64kb") == 64 * 1024
    assert parse_size("1G") == 1 << 30
    assert parse_size("2m+512k") == 2 * (1 << 20) + 512 * 1024
    assert parse_duration("90") == 90
    assert parse_duration("7days") == 7 * 86400
    assert parse_duration("1h+30min") == 5400
    assert parse_duration("1week") == 604800
    for bad in ("", "kb", "12 parsecs", "-1"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_parse_config_keys():
    text = """
    # Tank's keys, case-insensitive, spaces allowed
    log.segment.bytes = 128mb
    LOG.INDEX.INTERVAL.BYTES=8192
    log.index.size.max.bytes=1mb
    log.retention.secs=2days   # trailing comment
    log.retention.bytes=10gb
    retention.segments.count=5
    log.roll.secs=1h
    log.roll.jitter.secs=60
    flush.messages=1000
    flush.secs=5
    log.cleanup.policy=delete
    log.cleaner.min.cleanable.ratio=0.25
    """
    cfg = TopicConfig().with_text(text)
    assert cfg == TopicConfig(segment_bytes=128 << 20, index_interval_bytes=8192,
                              index_max_bytes=1 << 20, retention_secs=172800,
                              retention_bytes=10 << 30, retention_segments=5, roll_secs=3600,
                              roll_jitter_secs=60, flush_messages=1000, flush_secs=5,
                              cleanup_policy="delete", cleaner_min_ratio=0.25)
    assert TopicConfig().with_keys({"log.segment.bytes": 4096}).segment_bytes == 4096


@pytest.mark.parametrize("text", ["log.segment.bytes", "nope=1", "log.segment.bytes=",
                                  "log.segment.bytes=10", "retention.segments.count=1",
                                  "log.cleanup.policy=compact", "flush.messages=-3",
                                  "log.index.interval.bytes=" + "9" * 129,
                                  "log.cleaner.min.cleanable.ratio=2"])
def test_bad_config(text):
    with pytest.raises(InvalidConfig):
        parse_config(text)


async def test_create_topic_is_atomic_and_checked(tmp_path):
    async with store_at(tmp_path) as store:
        topic = await store.create_topic("orders", 3, "flush.messages=10\n")
        assert [p.index for p in topic.partitions] == [0, 1, 2]
        assert topic.config.flush_messages == 10
        assert sorted(x.name for x in tmp_path.iterdir()) == ["orders"]
        for bad in (lambda: store.create_topic("orders", 1),):
            with pytest.raises(TopicExists):
                await bad()
        with pytest.raises(InvalidTopicName):
            await store.create_topic("../x", 1)
        with pytest.raises(InvalidTopicName):
            await store.create_topic("ok", 0)
        with pytest.raises(InvalidTopicName):
            await store.create_topic("ok", MAX_PARTITIONS + 1)
        with pytest.raises(InvalidConfig):
            await store.create_topic("ok", 1, "bogus=1")
        assert store.topics() == ["orders"]
        assert not (tmp_path / "ok").exists() and not (tmp_path / ".ok").exists()


async def test_create_topic_failure_leaves_only_a_stray_that_is_cleaned(tmp_path, monkeypatch):
    def fail_sync(path):
        raise OSError(5, "I/O error")

    async with store_at(tmp_path) as store:
        monkeypatch.setattr(store_module, "sync_directory", fail_sync)
        with pytest.raises(StoreError):
            await store.create_topic("half", 2)
        assert store.topic("half") is None
        monkeypatch.undo()
    assert (tmp_path / ".half").exists()  # the crash-equivalent leftover
    async with store_at(tmp_path) as store:
        assert store.topics() == []
        await store.create_topic("half", 2)
    assert not (tmp_path / ".half").exists()


async def test_concurrent_creations_create_once_and_exists_means_there(tmp_path):
    async with store_at(tmp_path) as store:
        outcomes = []

        async def create():
            try:
                outcomes.append(await store.create_topic("auto"))
            except TopicExists:
                outcomes.append(store.topic("auto"))  # there once told it exists

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(create)
        assert len(outcomes) == 5 and None not in outcomes
        assert len({id(t) for t in outcomes}) == 1
        assert len(outcomes[0].partitions) == store.settings.default_partitions
        await outcomes[0].partitions[0].append(bundle(1))


async def test_invalid_config_file_falls_back_to_defaults(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
    (tmp_path / "t" / "config").write_text("log.segment.bytes=nonsense\n")
    async with store_at(tmp_path) as store:
        assert store.topic("t").config == store.settings.topic_defaults
        with pytest.raises(InvalidConfig):
            await store.reload_config("t", 0)


async def test_missing_partition_directories_are_recreated(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 3)
    (tmp_path / "t" / "1").rmdir()
    async with store_at(tmp_path) as store:
        assert len(store.topic("t").partitions) == 3
        await store.partition("t", 1).append(bundle(1))
