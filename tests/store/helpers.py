"""Helpers shared by the store tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gateway.store import LogStore, StoreSettings, TopicConfig, open_store
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


def settings(durability: str = "fsync", *, tail_cache_bytes: int = 0, **topic: Any
             ) -> StoreSettings:
    """Store settings with a tiny maintenance footprint and ``topic`` config overrides.

    The tail cache is off unless asked for, so reads exercise the segment files.
    """
    return StoreSettings(durability=durability, topic_defaults=TopicConfig(**topic),
                         maintenance_interval=float("inf"), tail_cache_bytes=tail_cache_bytes)


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


def all_messages(partition: Any, fetch_size: int = 1 << 20) -> list[Message]:
    """Every visible message of a partition, read chunk by chunk from the start."""
    out: list[Message] = []
    seq = 0
    while True:
        batch, seq = partition.read_messages(seq, fetch_size)
        if not batch:
            return out
        out += batch


def as_tuples(msgs: list[Message]) -> list[tuple[int, bytes, bytes | None, int]]:
    return [(m.seq, m.value, m.key, m.timestamp) for m in msgs]
