"""Helpers shared by the store tests."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from gateway.store import (
    NO_BOUNDS,
    LogStore,
    Partition,
    StoreIOError,
    StoreSettings,
    TopicConfig,
    open_store,
)
from protocols.errors import ProtocolError
from protocols.tank.bundle import Codec, Message, decode_chunk, encode_bundle


def messages(n: int, tag: str = "m", *, start: int = 0, size: int = 0,
             ts: int = 1_700_000_000_000) -> list[Message]:
    """``n`` distinct messages; ``size`` pads values to that many bytes."""
    out = []
    for i in range(start, start + n):
        value = f"{tag}{i}".encode()
        if size > len(value):
            value += b"." * (size - len(value))
        out.append(Message(value, key=(b"k%d" % i) if i % 3 == 0 else None, timestamp=ts + i))
    return out


def bundle(n: int = 1, tag: str = "m", *, codec: Codec | None = Codec.NONE, **kw: Any) -> bytes:
    """A plain bundle of ``n`` messages."""
    return encode_bundle(messages(n, tag, **kw), codec=codec)


def sparse_bundle(seqs: list[int], tag: str = "s", codec: Codec = Codec.NONE) -> bytes:
    """A sparse bundle whose messages carry the sequence numbers ``seqs``."""
    msgs = messages(len(seqs), tag)
    for m, seq in zip(msgs, seqs, strict=True):
        m.seq = seq
    return encode_bundle(msgs, codec=codec, sparse=True)


#: A descriptor number no test process has open: syncing it fails with EBADF.
NO_SUCH_FD = 1 << 20


def hold_fsyncs(monkeypatch: Any, when: Callable[[Any], bool] = lambda job: bool(job.fds)
                ) -> tuple[threading.Event, list[Any]]:
    """Hold back every fsync round whose job ``when`` picks until the returned event is
    set; the list records the held jobs. Uses the Python fsync threads (the C workers of
    ``gateway.store._fsync`` can not be held from Python): open the store after this."""
    import gateway.store.durability as durability
    import gateway.store.syncer as syncer

    gate = threading.Event()
    held: list[Any] = []
    real_run = durability.SyncJob.run

    def gated_run(job: Any) -> None:
        if when(job):
            held.append(job)
            assert gate.wait(10), "an fsync was held for 10 s"
        real_run(job)

    monkeypatch.setattr(syncer, "_native", None)
    monkeypatch.setattr(durability.SyncJob, "run", gated_run)
    return gate, held


def fail_fsyncs(partition: Any, monkeypatch: Any) -> None:
    """Make ``partition``'s fsync rounds fail (EBADF) until the monkeypatch is undone:
    every round then also syncs a descriptor that does not exist."""
    commit = partition._commit
    real = commit._prepare

    def broken() -> Any:
        job = real()
        job.fds.append(NO_SUCH_FD)
        return job

    monkeypatch.setattr(commit, "_prepare", broken)


def settings(durability: str = "fsync", *, tail_cache_bytes: int = 0, **topic: Any
             ) -> StoreSettings:
    """Store settings with a tiny maintenance footprint and ``topic`` config overrides.

    The tail cache is off unless asked for, so reads exercise the segment files. Config
    texts are not bound by the minimums (:data:`NO_BOUNDS`): tests force small segments.
    """
    return StoreSettings(durability=durability, topic_defaults=TopicConfig(**topic),
                         maintenance_interval=float("inf"), tail_cache_bytes=tail_cache_bytes,
                         config_bounds=NO_BOUNDS)


@asynccontextmanager
async def store_at(path: str | os.PathLike[str], durability: str = "fsync", *,
                   clock: Any = None, tail_cache_bytes: int = 0, **topic: Any
                   ) -> AsyncIterator[LogStore]:
    """Open a store without the periodic maintenance task."""
    kwargs = {"clock": clock} if clock is not None else {}
    async with open_store(path, settings(durability, tail_cache_bytes=tail_cache_bytes,
                                         **topic), maintenance=False, **kwargs) as store:
        yield store


def chunk_messages(data: bytes, base_seq: int | None, min_seq: int = 0) -> list[Message]:
    """Decode a chunk with the protocol codec."""
    return decode_chunk(data, base_seq, min_seq).messages


def segment_names(partition: Partition) -> list[str]:
    """File names of the partition's segments, oldest first."""
    return [segment.name for segment in partition._segments]


def read_messages(partition: Partition, seq: int, fetch_size: int
                  ) -> tuple[list[Message], int]:
    """Decoded messages from ``seq`` on (see :meth:`Partition.read`) and the next sequence
    to read. Messages of the first bundle below ``seq`` are skipped. At the tail the list
    is empty and the next sequence is ``seq`` itself."""
    with partition.read(seq, fetch_size) as result:
        if result.at_tail:
            return [], result.seq
        data = result.read_bytes()
    base = None if result.first_bundle_sparse else result.base_seq
    try:
        chunk = decode_chunk(data, base, result.seq)
    except ProtocolError as exc:
        raise StoreIOError(f"corrupt data in {partition.topic}/{partition.index}: {exc}"
                           ) from None
    return chunk.messages, chunk.next_seq


def all_messages(partition: Any, fetch_size: int = 1 << 20) -> list[Message]:
    """Every visible message of a partition, read chunk by chunk from the start."""
    out: list[Message] = []
    seq = 0
    while True:
        batch, seq = read_messages(partition, seq, fetch_size)
        if not batch:
            return out
        out += batch


def as_tuples(msgs: list[Message]) -> list[tuple[int, bytes, bytes | None, int]]:
    return [(m.seq, m.value, m.key, m.timestamp) for m in msgs]
