"""Message payloads: random bytes from a seed, optionally stamped with who sent them.

A stamped payload starts with a header (run id, publisher, index, send time) so a
receiver can tell every message apart, count losses and duplicates, and measure latency;
the rest is filler from a pool made once from the seed.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

#: ``u32 run | u32 publisher | u64 index | u64 stamp_ns`` (big-endian).
HEADER: Final = struct.Struct(">IIQQ")
HEADER_SIZE: Final = HEADER.size
_POOL_SIZE: Final = 1024 * 1024
_WORDS: Final = (b"alpha beta gamma delta order price quantity symbol market limit buy sell "
                 b"open close high low volume trade account region status ready").split()


class Payloads:
    """Payloads of ``size`` bytes drawn from a pool made from ``seed``.

    Random bytes do not compress; with ``compressible`` the pool is text from a small
    vocabulary, which Snappy shrinks to well under half.
    """

    def __init__(self, seed: int, size: int, *, compressible: bool = False) -> None:
        if size < 1:
            raise ValueError("payload size must be at least 1 byte")
        rng = random.Random(seed)
        pool_size = max(_POOL_SIZE, 4 * size)
        if compressible:
            words = bytearray()
            while len(words) < pool_size:
                words += rng.choice(_WORDS) + b" "
            self.pool = bytes(words[:pool_size])
        else:
            self.pool = rng.randbytes(pool_size)
        self.size = size
        self._span = pool_size - size

    def body(self, index: int) -> bytes:
        """Payload ``index``: ``size`` bytes of the pool (neighbours differ)."""
        start = (index * 7919) % self._span
        return self.pool[start:start + self.size]

    def stamped(self, run: int, publisher: int, index: int, stamp_ns: int) -> bytes:
        """A payload carrying its identity and send time in the first bytes."""
        if self.size < HEADER_SIZE:
            raise ValueError(f"stamped payloads need at least {HEADER_SIZE} bytes")
        start = (index * 7919) % self._span
        return (HEADER.pack(run, publisher, index, stamp_ns)
                + self.pool[start:start + self.size - HEADER_SIZE])


def read_stamp(data: bytes) -> tuple[int, int, int, int]:
    """``(run, publisher, index, stamp_ns)`` of a stamped payload."""
    return HEADER.unpack_from(data)


@dataclass
class Tally:
    """Counts which stamped messages of one run arrived, to find losses and duplicates.

    ``expected`` maps publisher -> how many messages it sent (indexes ``0..n-1``).
    Messages of another run are counted as ``foreign`` and otherwise ignored.
    """

    run: int
    expected: Mapping[int, int]
    received: int = 0
    duplicates: int = 0
    foreign: int = 0
    _seen: dict[int, bytearray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._seen = {p: bytearray(n) for p, n in self.expected.items()}

    @property
    def total_expected(self) -> int:
        return sum(self.expected.values())

    def add(self, data: bytes) -> int:
        """Count one message; returns its send stamp (ns), or -1 when it is not ours."""
        stamp: int
        run, publisher, index, stamp = HEADER.unpack_from(data)
        seen = self._seen.get(publisher)
        if run != self.run or seen is None or index >= len(seen):
            self.foreign += 1
            return -1
        if seen[index]:
            self.duplicates += 1
        else:
            seen[index] = 1
            self.received += 1
        return stamp

    @property
    def complete(self) -> bool:
        return self.received >= self.total_expected

    @property
    def lost(self) -> int:
        return self.total_expected - self.received

    def summary(self) -> dict[str, int]:
        """Counts for a report (``received`` counts distinct messages)."""
        return {"expected": self.total_expected, "received": self.received,
                "lost": self.lost, "duplicates": self.duplicates, "foreign": self.foreign}
