"""The embedded backend's shared reads (gateway/backend/shared.py): a read is shared only
while its partition is unchanged, only from memory, and within the memo's bounds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.backend import shared
from gateway.backend.embedded import EmbeddedBackend, EmbeddedSettings, open_embedded_backend
from gateway.backend.shared import SharedChunk
from gateway.core.config import Settings
from gateway.core.contract import FetchRequest, FetchStatus, ProduceBatch
from gateway.core.metrics import Metrics
from protocols.tank.bundle import Codec, Message, encode_bundle


def bundle(size: int = 10, count: int = 1) -> bytes:
    return encode_bundle([Message(b"v" * size, timestamp=1000)] * count, codec=Codec.NONE)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[EmbeddedBackend]:
    settings = Settings(data_dir=tmp_path / "data", durability="os")
    async with open_embedded_backend(EmbeddedSettings.of(settings), Metrics()) as backend:
        await backend.create_topic("t", 2)
        yield backend


async def _append(backend: EmbeddedBackend, data: bytes, partition: int = 0) -> None:
    outcomes = await backend.produce([ProduceBatch("t", partition, data)])
    assert outcomes[0].code == 0


async def test_readers_share_until_the_partition_changes(backend: EmbeddedBackend) -> None:
    memo = backend.shared_reads
    assert memo is not None
    await _append(backend, bundle())
    first = backend.fetch_nowait([FetchRequest("t", 0, 1, 4096)])
    second = backend.fetch_nowait([FetchRequest("t", 0, 1, 4096)])
    assert first is not None and second is not None
    assert type(first[0].chunk) is SharedChunk and second[0].chunk is first[0].chunk
    assert first[0] is not second[0] and first[0] == second[0]
    assert memo.hits == 1
    # Another size bound, another partition: reads of their own.
    other = backend.fetch_nowait([FetchRequest("t", 0, 1, 100)])
    assert other is not None and other[0].chunk is not first[0].chunk
    await _append(backend, bundle(), partition=1)
    assert memo.hits == 1
    # An append to the partition: the same request reads again, and sees it.
    await _append(backend, bundle())
    again = backend.fetch_nowait([FetchRequest("t", 0, 1, 4096)])
    assert again is not None and again[0].chunk is not first[0].chunk
    assert again[0].high_water_mark == 2 and again[0].chunk.length > first[0].chunk.length
    assert memo.hits == 1


async def test_empty_reads_and_big_ones_are_not_shared(backend: EmbeddedBackend,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    memo = backend.shared_reads
    assert memo is not None
    await _append(backend, bundle(size=3000))
    assert backend.fetch_nowait([FetchRequest("t", 0, 2, 4096)]) is None  # at the tail
    assert len(memo) == 0
    monkeypatch.setattr(shared, "MAX_SHARED_CHUNK", 1000)
    got = backend.fetch_nowait([FetchRequest("t", 0, 1, 4096)])
    assert got is not None and got[0].status is FetchStatus.DATA
    assert type(got[0].chunk) is not SharedChunk and got[0].chunk.length > 3000
    got[0].chunk.close()
    assert len(memo) == 0


async def test_the_memo_is_bounded(backend: EmbeddedBackend,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    memo = backend.shared_reads
    assert memo is not None
    monkeypatch.setattr(shared, "MAX_SHARED_ENTRIES", 3)
    for _ in range(5):
        await _append(backend, bundle())
    for seq in range(1, 6):
        assert backend.fetch_nowait([FetchRequest("t", 0, seq, 4096)]) is not None
        assert len(memo) <= 3
    assert memo.size == sum(
        o.chunk.length for reads in memo._partitions.values() for o in reads.reads.values())


async def test_a_closed_partition_is_not_served_from_the_memo(backend: EmbeddedBackend
                                                              ) -> None:
    memo = backend.shared_reads
    assert memo is not None
    await _append(backend, bundle())
    partition = backend.store.partition("t", 0)
    assert backend.fetch_nowait([FetchRequest("t", 0, 1, 4096)]) is not None
    assert memo.get(partition, 1, 4096) is not None
    partition.close_now()
    assert memo.get(partition, 1, 4096) is None
    assert len(memo) == 0
