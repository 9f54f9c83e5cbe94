"""ListOffsets by timestamp (issue 17): a bisection over sequence numbers
(:mod:`gateway.backend.timelookup`), on real segment files.

Its cost is counted in reads and bytes, not wall time: it stays logarithmic when the
partition grows tenfold over many segments, and its answers are those of a linear scan
(Kafka's first message at or after the time). librdkafka's ``offsets_for_times`` agrees.
"""

from __future__ import annotations

import math
import random

import confluent_kafka as ck
import trio

from gateway.backend.embedded import EmbeddedBackend, EmbeddedSettings, open_embedded_backend
from gateway.backend.timelookup import PROBE_BYTES, find_by_time
from gateway.core.config import Settings
from gateway.core.contract import ProduceBatch, ProduceCode
from gateway.store.config import NO_BOUNDS
from protocols.tank.bundle import Message, encode_bundle
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server

PER_BUNDLE = 10
BASE = 1_700_000_000_000


async def _fill(backend: EmbeddedBackend, topic: str, stamps: list[int]) -> None:
    """Append ``stamps`` (one message each) as bundles of PER_BUNDLE messages."""
    batches = [ProduceBatch(topic, 0, encode_bundle(
        [Message(b"x" * 20, timestamp=t) for t in stamps[i:i + PER_BUNDLE]], codec=0))
        for i in range(0, len(stamps), PER_BUNDLE)]
    for start in range(0, len(batches), 200):
        outcomes = await backend.produce(batches[start:start + 200])
        assert {o.code for o in outcomes} == {ProduceCode.OK}


def _linear(stamps: list[int], when: int) -> int | None:
    """The reference: the sequence number of the first message at or after ``when``."""
    return next((i + 1 for i, t in enumerate(stamps) if t >= when), None)


async def _lookup(backend: EmbeddedBackend, topic: str, when: int):
    info = (await backend.discover_partitions(topic))[0]
    return await find_by_time(backend, topic, 0, when, info.first_available,
                              info.high_water_mark)


async def test_lookup_cost_is_logarithmic_over_many_segments(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", durability="os")
    costs = {}
    async with open_embedded_backend(EmbeddedSettings.of(settings),
                                     config_bounds=NO_BOUNDS) as backend:
        for count in (1_000, 10_000):
            topic = f"t{count}"
            # Non-decreasing, with runs of equal times (a bundle's messages often share one).
            stamps = [BASE + 7 * (i // 3) for i in range(count)]
            await backend.create_topic(topic, 1, "log.segment.bytes=4096")
            await _fill(backend, topic, stamps)
            segments = len([p for p in (settings.data_dir / topic / "0").iterdir()
                            if p.suffix in (".log", ".ilog")])
            assert segments >= count // 200  # many segments
            worst = 0
            for when in [BASE - 1, BASE, stamps[count // 3] + 1, stamps[-1], stamps[-1] + 1,
                         *(BASE + 7 * k + 3 for k in range(0, count // 3, count // 30))]:
                found = await _lookup(backend, topic, when)
                assert found.seq == _linear(stamps, when), when
                if found.seq is not None:
                    assert found.timestamp == stamps[found.seq - 1]
                worst = max(worst, found.reads)
                assert found.bytes_read <= found.reads * (PROBE_BYTES + 1024)
            costs[count] = worst
    # log2 of the bundles, plus a step or two: not the partition's size.
    assert costs[1_000] <= math.log2(1_000 / PER_BUNDLE) + 3
    assert costs[10_000] <= math.log2(10_000 / PER_BUNDLE) + 3
    assert costs[10_000] <= costs[1_000] + 5  # tenfold the data, a few more reads


async def test_decreasing_timestamps_still_answer_at_or_after(tmp_path):
    """One producer's clock jumped back: the answer's time is at or after the asked one,
    and it is the first such after the last message the bisection saw before it."""
    settings = Settings(data_dir=tmp_path / "data", durability="os")
    stamps = [BASE + i for i in range(500)] + [BASE + i for i in range(100, 600)]
    async with open_embedded_backend(EmbeddedSettings.of(settings),
                                     config_bounds=NO_BOUNDS) as backend:
        await backend.create_topic("jump", 1, "log.segment.bytes=4096")
        await _fill(backend, "jump", stamps)
        for when in (BASE + 50, BASE + 300, BASE + 550, BASE + 600):
            found = await _lookup(backend, "jump", when)
            if found.seq is None:
                assert when > max(stamps)
                continue
            assert stamps[found.seq - 1] >= when
            assert found.seq == 1 or stamps[found.seq - 2] < when
        # Only the second run reaches 550: its first such message.
        assert (await _lookup(backend, "jump", BASE + 550)).seq == 951


async def test_librdkafka_offsets_for_times_over_many_segments(tmp_path):
    stamps = [BASE + 10 * i for i in range(2_000)]

    def script(addr: str) -> list[int]:
        noise = random.Random(7)
        producer = ck.Producer({**CONFLUENT, "bootstrap.servers": addr, "linger.ms": 20})
        for i, when in enumerate(stamps):
            producer.produce("times", value=noise.randbytes(500), partition=0,
                             timestamp=when)  # incompressible: many segments
            if i % 100 == 99:  # a bundle or so each time, in segments of 64 KiB
                producer.flush(10)
        assert producer.flush(10) == 0
        consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": "u"})
        try:
            asked = [BASE - 5, BASE + 5, BASE + 10 * 1234, BASE + 10 * 1999 - 1,
                     BASE + 10 * 2000]
            return [consumer.offsets_for_times([ck.TopicPartition("times", 0, when)],
                                                timeout=10)[0].offset for when in asked]
        finally:
            consumer.close()

    async with kafka_server(tmp_path, topic_config={"log.segment.bytes": "65536"}) as server:
        with trio.fail_after(30):
            offsets = await trio.to_thread.run_sync(script, bootstrap(server))
        segments = len(list((tmp_path / "data" / "times" / "0").glob("*log")))
    assert segments >= 10
    assert offsets == [0, 1, 1234, 1999, -1]
