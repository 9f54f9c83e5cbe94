"""The embedded backend over a real store in a temp dir: produce, fetch, long poll, admin."""

import inspect
from pathlib import Path

import pytest
import trio

from gateway.backend.bridge.backend import BridgeBackend
from gateway.backend.embedded import EmbeddedBackend, EmbeddedSettings, open_embedded_backend
from gateway.backend.kafka.backend import KafkaBackend
from gateway.core.config import Settings
from gateway.core.contract import (
    AutoCreate,
    Backend,
    CreateTopicCode,
    FetchRequest,
    FetchStatus,
    ProduceBatch,
    ProduceCode,
    ReloadConfCode,
    TopicRefused,
    ensure_topic,
)
from gateway.core.metrics import Metrics
from protocols.tank.bundle import Message, chunk_end, decode_chunk, encode_bundle
from protocols.wire import UINT64_MAX


def bundle(*values: bytes) -> bytes:
    return encode_bundle([Message(v, timestamp=1000) for v in values])


def values_of(outcome) -> list[tuple[int, bytes]]:
    try:
        data = outcome.chunk.read_bytes()
        chunk = decode_chunk(data, outcome.base_seq)
        return [(m.seq, m.value) for m in chunk.messages]
    finally:
        outcome.chunk.close()


@pytest.fixture
async def backend(tmp_path: Path):
    settings = Settings(data_dir=tmp_path / "data", durability="os")
    async with open_embedded_backend(EmbeddedSettings.of(settings), Metrics()) as backend:
        yield backend


@pytest.mark.parametrize("implementation", [EmbeddedBackend, BridgeBackend, KafkaBackend])
def test_backends_implement_every_call_of_the_protocol(implementation: type) -> None:
    # The listeners only know the Backend protocol: both logs must answer all of it alike.
    calls = [name for name in vars(Backend) if not name.startswith("_")]
    assert {"produce", "fetch", "create_topic", "discover_partitions", "aclose"} <= set(calls)
    for name in calls:
        if name == "auto_create":
            continue
        wanted = inspect.signature(getattr(Backend, name))
        got = inspect.signature(getattr(implementation, name))
        assert list(got.parameters) == list(wanted.parameters), name
        assert inspect.iscoroutinefunction(getattr(implementation, name)) == \
            inspect.iscoroutinefunction(getattr(Backend, name)), name


async def test_produce_then_fetch(backend: EmbeddedBackend) -> None:
    outcomes = await backend.produce([
        ProduceBatch("events", 0, bundle(b"a", b"b")),
        ProduceBatch("events", 0, bundle(b"c")),
    ])
    assert [(o.code, o.first_seq, o.last_seq) for o in outcomes] == [
        (ProduceCode.OK, 1, 2), (ProduceCode.OK, 3, 3)]
    [fetched] = await backend.fetch([FetchRequest("events", 0, 2, 1024)],
                                    max_wait_ms=0, min_bytes=0)
    assert fetched.status is FetchStatus.DATA
    assert fetched.high_water_mark == 3
    # Whole bundles from the one holding seq 2: the client skips seq 1.
    assert values_of(fetched) == [(1, b"a"), (2, b"b"), (3, b"c")]


async def test_produce_errors_per_partition(backend: EmbeddedBackend) -> None:
    await backend.create_topic("two", 2)
    outcomes = await backend.produce([
        ProduceBatch("two", 5, bundle(b"x")),
        ProduceBatch("two", 0, b"\xff\x00garbage"),
        ProduceBatch("two", 1, bundle(b"ok")),
        ProduceBatch("bad/name", 0, bundle(b"x")),
    ])
    assert [o.code for o in outcomes] == [ProduceCode.UNKNOWN_PARTITION, ProduceCode.IO_FAULT,
                                          ProduceCode.OK, ProduceCode.UNKNOWN_TOPIC]
    # The malformed bundle appended nothing.
    info = await backend.discover_partitions("two")
    assert info is not None and info[0].high_water_mark == 0


async def test_no_auto_create(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, auto_create_topics=False, durability="os")
    async with open_embedded_backend(EmbeddedSettings.of(settings)) as backend:
        [outcome] = await backend.produce([ProduceBatch("t", 0, bundle(b"x"))])
        assert outcome.code is ProduceCode.UNKNOWN_TOPIC
        assert await backend.discover_partitions("t") is None


async def test_ensure_topic_creates_as_the_policy_says(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, durability="os", default_partitions=2)
    async with open_embedded_backend(EmbeddedSettings.of(settings)) as backend:
        assert backend.auto_create == AutoCreate(True, 2)
        assert [p.high_water_mark for p in await ensure_topic(backend, "fresh")] == [0, 0]
        with pytest.raises(TopicRefused, match="unknown topic") as refused:
            await ensure_topic(backend, "../no")
        assert refused.value.code is None
        backend.auto_create = AutoCreate(False, 2)
        with pytest.raises(TopicRefused, match="unknown topic 'other'"):
            await ensure_topic(backend, "other")
        assert len(await ensure_topic(backend, "fresh")) == 2  # there: no creation


async def test_a_failed_creation_is_refused_with_its_code() -> None:
    async def failing(name: str, partitions: int) -> CreateTopicCode:
        return CreateTopicCode.SYSTEM_ERROR

    with pytest.raises(TopicRefused, match="could not create topic 'x': system_error") as exc:
        await AutoCreate().create("x", failing)
    assert exc.value.code is CreateTopicCode.SYSTEM_ERROR


async def test_produce_and_attach_creating_one_topic_at_once(
        backend: EmbeddedBackend) -> None:
    outcomes: list = []
    bounds: list = []

    async def produce() -> None:
        outcomes.extend(await backend.produce([ProduceBatch("race", 0, bundle(b"x"))]))

    async def attach() -> None:
        bounds.append(await ensure_topic(backend, "race"))

    async with trio.open_nursery() as nursery:
        for start in (attach, produce, attach):
            nursery.start_soon(start)
    assert [o.code for o in outcomes] == [ProduceCode.OK]
    assert len(bounds) == 2 and all(len(b) == 1 for b in bounds)


async def test_fetch_outcome_fields(backend: EmbeddedBackend) -> None:
    await backend.produce([ProduceBatch("f", 0, bundle(b"1", b"2"))])
    data, tail = await backend.fetch([FetchRequest("f", 0, 2, 4096),
                                      FetchRequest("f", 0, UINT64_MAX, 4096)],
                                     max_wait_ms=0, min_bytes=0)
    assert (data.base_seq, data.resolved_seq, data.chunk.length > 0) == (1, 2, True)
    data.chunk.close()
    # An empty read: no bundle, so no base; where the request resolved to, its own field.
    assert (tail.base_seq, tail.resolved_seq, tail.chunk.length) == (None, 3, 0)


async def test_base_seq_and_invalid_sequence(backend: EmbeddedBackend) -> None:
    ok, stale = await backend.produce([ProduceBatch("s", 0, bundle(b"x"), base_seq=10),
                                       ProduceBatch("s", 0, bundle(b"y"), base_seq=5)])
    assert (ok.code, ok.first_seq) == (ProduceCode.OK, 10)
    assert stale.code is ProduceCode.INVALID_SEQUENCE


async def test_fetch_unknown_and_boundary(backend: EmbeddedBackend) -> None:
    await backend.produce([ProduceBatch("b", 0, bundle(b"1", b"2"))])
    unknown_topic, unknown_part, past_end, tail = await backend.fetch([
        FetchRequest("nope", 0, 1, 100), FetchRequest("b", 3, 1, 100),
        FetchRequest("b", 0, 9, 100), FetchRequest("b", 0, 3, 100)],
        max_wait_ms=5000, min_bytes=0)
    assert unknown_topic.status is FetchStatus.UNKNOWN_TOPIC
    assert unknown_part.status is FetchStatus.UNKNOWN_PARTITION
    assert past_end.status is FetchStatus.BOUNDARY
    assert (past_end.first_available, past_end.high_water_mark) == (1, 2)
    assert tail.chunk.length == 0  # answered at once: another partition had an error


async def test_long_poll_wakes_on_append(backend: EmbeddedBackend) -> None:
    await backend.produce([ProduceBatch("lp", 0, bundle(b"old"))])
    result = []

    async def consumer() -> None:
        result.extend(await backend.fetch([FetchRequest("lp", 0, UINT64_MAX, 4096)],
                                          max_wait_ms=10_000, min_bytes=0))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.sleep(0.05)
            assert not result
            await backend.produce([ProduceBatch("lp", 0, bundle(b"new"))])
    # The tail was resolved when the request arrived: the new message, not a later tail.
    assert values_of(result[0]) == [(2, b"new")]


async def test_long_poll_times_out_with_empty_chunk(backend: EmbeddedBackend) -> None:
    await backend.create_topic("quiet", 1)
    start = trio.current_time()
    [outcome] = await backend.fetch([FetchRequest("quiet", 0, 1, 4096)],
                                    max_wait_ms=50, min_bytes=0)
    waited = trio.current_time() - start
    assert outcome.status is FetchStatus.DATA and outcome.chunk.length == 0
    assert waited >= 0.05


async def test_min_bytes_across_partitions(backend: EmbeddedBackend) -> None:
    await backend.create_topic("mb", 2)
    result = []

    async def consumer() -> None:
        result.extend(await backend.fetch(
            [FetchRequest("mb", 0, 1, 4096), FetchRequest("mb", 1, 1, 4096)],
            max_wait_ms=10_000, min_bytes=200))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.sleep(0.02)
            await backend.produce([ProduceBatch("mb", 0, bundle(b"x" * 50))])
            await trio.sleep(0.05)
            assert not result  # 50-odd bytes appended: below min_bytes
            await backend.produce([ProduceBatch("mb", 1, bundle(b"y" * 200))])
    assert [len(values_of(o)) for o in result] == [1, 1]


async def test_admin_requests(backend: EmbeddedBackend) -> None:
    assert await backend.create_topic("adm", 3) is CreateTopicCode.OK
    assert await backend.create_topic("adm", 3) is CreateTopicCode.EXISTS
    assert await backend.create_topic("bad..name", 1) is CreateTopicCode.INVALID
    assert await backend.create_topic("zero", 0) is CreateTopicCode.INVALID
    assert await backend.create_topic("cfg", 1, "log.segment.bytes=banana") is \
        CreateTopicCode.BAD_CONFIG
    topics = {t.name: t.partitions for t in await backend.discover_topics()}
    assert topics == {"adm": 3}
    assert [(p.first_available, p.high_water_mark)
            for p in await backend.discover_partitions("adm")] == [(0, 0)] * 3
    assert await backend.reload_conf("adm", 1) is ReloadConfCode.OK
    assert await backend.reload_conf("adm", 7) is ReloadConfCode.UNKNOWN_PARTITION
    assert await backend.reload_conf("none", 0) is ReloadConfCode.UNKNOWN_TOPIC
    status = await backend.status()
    assert (status.topics, status.partitions) == (1, 3)


async def test_metrics_count_appends_and_sizes(tmp_path: Path) -> None:
    metrics = Metrics()
    settings = EmbeddedSettings.of(Settings(data_dir=tmp_path, durability="fsync"))
    async with open_embedded_backend(settings, metrics) as backend:
        await backend.produce([ProduceBatch("m", 0, bundle(b"a", b"b", b"c"))])
        text = metrics.render().decode()
    assert 'figtank_messages_in_total{topic="m"} 3.0' in text
    assert 'figtank_partition_bytes{partition="0",topic="m"}' in text
    assert "figtank_append_seconds_count 1.0" in text
    fsyncs = next(line for line in text.splitlines()
                  if line.startswith("figtank_fsync_seconds_count"))
    assert float(fsyncs.split()[1]) >= 1


def fsync_count(metrics: Metrics) -> float:
    line = next(line for line in metrics.render().decode().splitlines()
                if line.startswith("figtank_fsync_seconds_count"))
    return float(line.split()[1])


async def test_bundles_of_one_partition_share_a_group_fsync(tmp_path: Path) -> None:
    metrics = Metrics()
    settings = EmbeddedSettings.of(Settings(data_dir=tmp_path, durability="fsync"))
    async with open_embedded_backend(settings, metrics) as backend:
        await backend.produce([ProduceBatch("g", 0, bundle(b"first"))])
        before = fsync_count(metrics)
        outcomes = await backend.produce(
            [ProduceBatch("g", 0, bundle(f"m{i}".encode())) for i in range(8)])
        assert [o.first_seq for o in outcomes] == list(range(2, 10))
        # Eight bundles of one partition in one produce: written together, one fsync round.
        assert fsync_count(metrics) - before == 1


async def test_append_many_reports_each_entry(tmp_path: Path) -> None:
    from gateway.store import AppendResult, InvalidBundle, InvalidSequence

    settings = EmbeddedSettings.of(Settings(data_dir=tmp_path, durability="fsync"))
    async with open_embedded_backend(settings) as b:
        await b.create_topic("e", 1)
        partition = b.store.partition("e", 0)
        results = await partition.append_many([
            (bundle(b"a"), None), (b"\xff\xff", None), (bundle(b"b"), 1), (bundle(b"c"), None)])
        assert isinstance(results[0], AppendResult) and results[0].first_seq == 1
        assert isinstance(results[1], InvalidBundle)
        assert isinstance(results[2], InvalidSequence)
        assert isinstance(results[3], AppendResult) and results[3].first_seq == 2
        assert partition.high_water_mark == 2


@pytest.mark.parametrize("tail_cache_bytes", [0, 1 << 20])
async def test_a_fetch_says_where_the_next_read_starts_as_the_chunk_headers_do(
        tmp_path: Path, tail_cache_bytes: int) -> None:
    """``FetchOutcome.next_seq`` (what the tail reader goes on from) is where
    :func:`~protocols.tank.bundle.chunk_end` finds the chunk leaves its reader: reads
    from the segment files and from the tail cache, plain and sparse bundles, a gap."""
    settings = Settings(data_dir=tmp_path, durability="os", tail_cache_bytes=tail_cache_bytes)
    async with open_embedded_backend(EmbeddedSettings.of(settings)) as backend:
        batches = [ProduceBatch("n", 0, bundle(*[b"v%d" % i] * (1 + i % 4)))
                   for i in range(12)]
        batches.insert(5, ProduceBatch("n", 0, bundle(b"after a gap"), base_seq=40))
        for batch in batches:
            [done] = await backend.produce([batch])
            assert done.code is ProduceCode.OK
        [info] = await backend.discover_partitions("n") or []
        checked = 0
        for seq in range(1, info.high_water_mark + 1):
            for size in (1, 40, 4096):
                [got] = await backend.fetch([FetchRequest("n", 0, seq, size)],
                                            max_wait_ms=0, min_bytes=0)
                try:
                    data = got.chunk.read_bytes()
                finally:
                    got.chunk.close()
                assert got.next_seq == chunk_end(data, got.base_seq, seq)[0], (seq, size)
                assert got.next_seq > seq
                checked += 1
        assert checked > 100
