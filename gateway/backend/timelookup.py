"""The first message at or after a time, by bisection over sequence numbers.

Neither log keeps a time index: Tank's on-disk format has none (its segment file names
carry the broker's wall-clock seconds when a segment was created or rolled, not the
messages' timestamps, which producers set), and a Tank broker has no request that looks
a time up. What both backends can do cheaply is read the bundle holding a sequence
number (:meth:`~gateway.core.contract.Backend.fetch`: the embedded store finds it
through the segment list and sparse index; a Tank broker the same way), so a lookup
bisects the partition's sequence range, reading one bundle per step and narrowing by all
of that bundle's messages: O(log n) small reads (about ``log2(messages / bundle size)``),
whatever the partition's size, instead of reading it from the start.

The answer is Kafka's: the first message whose timestamp is at or after the one asked,
exactly, when timestamps never decrease along the partition (the usual case: one
producer's clock, or increasing create times). When they do decrease somewhere, the
answer is a message at or after the time whose predecessor in the bisection's last
narrowing step is before it; an earlier message at or after the time may exist (Kafka's
own time index gives a comparable guarantee: it indexes the largest time seen so far).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gateway.core.contract import Backend, FetchRequest, FetchStatus
from protocols.tank.bundle import Message, decode_chunk

#: Bytes asked per probe: the store answers with the whole bundle holding the sequence;
#: a Tank broker may cut it, and is then asked again for the bundle's full length.
PROBE_BYTES: Final = 4096


@dataclass(slots=True)
class TimeLookup:
    """A lookup's answer and what it cost."""

    #: Sequence number of the message found, None when no message is at or after the time.
    seq: int | None = None
    #: Its timestamp (milliseconds); -1 when none was found.
    timestamp: int = -1
    #: Fetches made (each reads about one bundle).
    reads: int = 0
    #: Chunk bytes those fetches read.
    bytes_read: int = 0


async def find_by_time(backend: Backend, topic: str, partition: int, timestamp: int,
                       first: int, high_water_mark: int) -> TimeLookup:
    """The first message of ``topic``/``partition`` whose timestamp is >= ``timestamp``
    (see the module doc), searching sequence numbers ``first``..``high_water_mark``."""
    found = TimeLookup()
    lo, hi = max(first, 1), high_water_mark + 1
    # Invariants: the messages probed below lo are before the time; the first message at
    # or after hi (found, when set) is at or after it.
    while lo < hi:
        mid = (lo + hi) // 2
        messages, resume = await _bundle_at(backend, topic, partition, mid, found)
        if messages is None:  # the partition is gone or failing: no answer
            return TimeLookup(reads=found.reads, bytes_read=found.bytes_read)
        if resume is not None and resume > mid:  # mid is below what is still stored
            lo = max(lo, resume)
            continue
        inside = [m for m in messages if lo <= m.seq < hi]
        if not inside:  # nothing stored from mid up to hi
            hi = mid
            continue
        at = next((m for m in inside if m.timestamp >= timestamp), None)
        if at is None:
            lo = inside[-1].seq + 1
        else:
            found.seq, found.timestamp = at.seq, at.timestamp
            hi = at.seq
            if at is not inside[0]:
                lo = hi  # its predecessor is before the time: this is the answer
    return found


async def _bundle_at(backend: Backend, topic: str, partition: int, seq: int,
                     cost: TimeLookup) -> tuple[list[Message] | None, int | None]:
    """The messages of the whole bundles read from the one holding ``seq`` (or the first
    after it; none past the end), and the first available sequence when ``seq`` is below
    it."""
    size = PROBE_BYTES
    while True:
        wanted = [FetchRequest(topic, partition, seq, size)]
        got = backend.fetch_nowait(wanted)
        if got is None:
            got = await backend.fetch(wanted, max_wait_ms=0, min_bytes=0)
        outcome = got[0]
        try:
            if outcome.status is FetchStatus.BOUNDARY and seq < outcome.first_available:
                return [], outcome.first_available
            if outcome.status is not FetchStatus.DATA:
                return (None, None) if outcome.status is not FetchStatus.BOUNDARY else ([], None)
            chunk = outcome.chunk.read_bytes()
        finally:
            outcome.chunk.close()
        cost.reads += 1
        cost.bytes_read += len(chunk)
        if not chunk:
            return [], None
        decoded = decode_chunk(chunk, outcome.base_seq)
        if decoded.consumed == 0 and decoded.partial_bundle_len:
            size = max(size * 2, decoded.partial_bundle_len)  # a bundle cut short
            continue
        return decoded.messages, None
