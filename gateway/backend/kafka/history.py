"""Reads away from the tail: one Fetch from the position asked, not waiting for data, and
the next one read ahead.

A reader older than its partition's feed cache, or ahead of the feed, is answered with one
upstream Fetch from its position (:func:`~gateway.backend.kafka.fetcher.fetch_partition`):
Fetch is a stateless request, so no consumer is kept or positioned for it. A read asks
for at most :data:`MAX_READ_BYTES`, whatever the reader asked (it asks again): an answer
of tens of megabytes would come in buffers the C allocator maps afresh, page by page,
for each read, on both sides (over ``gateway.io.allocator.MMAP_THRESHOLD``): a 102 MB
``tank-cli consume``, which asks 64 MiB a read, took 1.0 s through the gateway with
64 MiB Fetches, 0.75-0.85 s with 4 MiB, 0.45-0.5 s with 2 MiB and 0.6 s with 1 MiB.

A read that leaves records before the watermark starts the Fetch of what follows it at
once, in the background (a *read-ahead*): while the gateway turns one answer into bundles
and the reader takes them, the upstream reads the next, instead of each side waiting on
the other. The reader's next read (same partition, the sequence that follows, asking as
much or more) takes it, waiting for it if it is still on its way. None is started for
what the partition's feed already caches. At most ``read_ahead``
(``upstream_kafka.read_ahead``) are held at once, each one Fetch of at most
:data:`MAX_READ_BYTES`, and together at most two reads' worth each once converted (an
answer of compressed batches becomes larger bundles): one that would hold more is not
kept, and its read asks again itself. One not taken within :data:`READ_AHEAD_SECS` of its
arrival is dropped; one taken, or given up on by its read, is let go at once (a Fetch
still on its way is cancelled): its task ends and keeps no reference to what it read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
import trio

from gateway.backend.kafka.cluster import Cluster
from gateway.backend.kafka.fetcher import NO_WAIT_MS, fetch_partition
from gateway.backend.kafka.wire import BrokerLost
from gateway.core.metrics import LoopCount, Metrics
from protocols.kafka.upstream_codec import UpstreamBundle

__all__ = ["MAX_READ_BYTES", "HistoryRead", "HistoryReader"]

#: The most one history read asks the upstream for.
MAX_READ_BYTES: Final = 2 * 1024 * 1024
#: The max wait of the second Fetch of a read the first found empty before the watermark.
NOTHING_YET_WAIT_MS: Final = 200
log = structlog.get_logger("figtank.upstream_kafka")

#: How long a read-ahead that arrived waits to be taken before it is dropped.
READ_AHEAD_SECS: Final = 5.0
#: What becomes of a read-ahead (``figtank_upstream_read_aheads{outcome}``): taken by the
#: read it was for; dropped (not taken in time, or asking more than that read); failed
#: (that read asked again itself).
OUTCOMES: Final = ("taken", "dropped", "failed")


@dataclass(slots=True)
class HistoryRead:
    """What one read found: bundles, or an error (Kafka's name, text); the partition's
    high watermark as the leader told it (0: unknown)."""

    bundles: list[UpstreamBundle] = field(default_factory=list)
    error: tuple[str, str] | None = None
    high_water_mark: int = 0

    @property
    def size(self) -> int:
        """The bytes of its bundles."""
        return sum(len(b.framed) for b in self.bundles)


@dataclass(slots=True, eq=False)
class _ReadAhead:
    """A read started before it was asked for: ``read`` once ``arrived`` is set;
    ``let_go`` once the read it was for took it or gave up on it, or it was dropped (its
    task then ends, holding nothing; one still fetching is cancelled)."""

    max_bytes: int
    arrived: trio.Event = field(default_factory=trio.Event)
    let_go: trio.Event = field(default_factory=trio.Event)
    fetching: trio.CancelScope = field(default_factory=trio.CancelScope)
    read: HistoryRead | None = None
    #: The bytes it holds (counted in the reader's total while it holds them).
    size: int = 0


class HistoryReader:
    """One Fetch per read, and the next one read ahead; see the module doc."""

    def __init__(self, cluster: Cluster, *, timeout: float = 5.0, read_ahead: int = 16,
                 ahead_secs: float = READ_AHEAD_SECS, metrics: Metrics | None = None,
                 spawn: Callable[..., Any] | None = None) -> None:
        self._cluster = cluster
        self.timeout = timeout
        #: The most read-aheads held at once (0: none), and how long one that arrived
        #: waits to be taken.
        self.read_ahead, self.ahead_secs = read_ahead, ahead_secs
        #: Starts a background task (the backend's nursery); None: no read-ahead.
        self.spawn = spawn
        self._ahead: dict[tuple[str, int, int], _ReadAhead] = {}
        #: What all read-aheads together may hold once converted: two reads' worth each
        #: (an answer of compressed batches becomes larger bundles).
        self.max_held_bytes = read_ahead * 2 * MAX_READ_BYTES
        #: Read-aheads on their way, or arrived and not let go; the bytes those hold.
        self._running = 0
        self._held_bytes = 0
        #: How many read-aheads came to each of :data:`OUTCOMES`.
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self._counted: dict[str, LoopCount] | None = None
        if metrics is not None:
            metrics.include(metrics.upstream_read_aheads)
            self._counted = {outcome: metrics.loop_count(
                metrics.upstream_read_aheads.labels(outcome)) for outcome in OUTCOMES}

    def held(self) -> int:
        """The read-aheads held: on their way, or arrived and not taken yet."""
        return self._running

    def held_bytes(self) -> int:
        """The bytes the arrived read-aheads hold (a plain int: read from any thread)."""
        return self._held_bytes

    def _came_to(self, outcome: str, count: int = 1) -> None:
        self.outcomes[outcome] += count
        if self._counted is not None:
            self._counted[outcome].inc(count)

    async def read(self, topic: str, partition: int, seq: int, max_bytes: int, *,
                   ahead_before: int | None = None) -> HistoryRead:
        """About ``max_bytes`` of ``topic``/``partition`` from sequence ``seq`` (offset
        ``seq - 1``); an error ``NETWORK_EXCEPTION`` when the upstream can not be asked.
        What follows is read ahead unless it is at or past ``ahead_before`` (where the
        partition's feed serves the reader from its cache)."""
        max_bytes = min(max_bytes, MAX_READ_BYTES)
        got = await self._taken(topic, partition, seq, max_bytes)
        if got is None:
            got = await self._fetch(topic, partition, seq, max_bytes)
        if got.bundles and got.error is None:
            following = got.bundles[-1].last_seq + 1
            if following <= got.high_water_mark and (ahead_before is None
                                                     or following < ahead_before):
                self._start(topic, partition, following, max_bytes)
        return got

    async def _taken(self, topic: str, partition: int, seq: int, max_bytes: int
                     ) -> HistoryRead | None:
        """The read-ahead of this read, once it arrived; None when there is none to use.
        Its Fetch is bounded as this read's own would be: waiting for it costs no more
        than asking again."""
        ahead = self._ahead.pop((topic, partition, seq), None)
        if ahead is None:
            return None
        try:
            if ahead.max_bytes > max_bytes:  # it may hold more than this read asks
                self._came_to("dropped")
                return None
            await ahead.arrived.wait()
            read = ahead.read
        finally:
            self._let_go(ahead)
        if read is None or read.error is not None or not read.bundles:
            self._came_to("failed")  # this read asks again itself
            return None
        self._came_to("taken")
        return read

    def _start(self, topic: str, partition: int, seq: int, max_bytes: int) -> None:
        if self.spawn is None or self.read_ahead <= 0:
            return
        key = (topic, partition, seq)
        if key in self._ahead or self._running >= self.read_ahead:
            return
        ahead = _ReadAhead(max_bytes)
        try:
            self.spawn(self._read_ahead, key, ahead)
        except RuntimeError:  # the backend is closing: its nursery takes no more tasks
            return
        self._ahead[key] = ahead
        self._running += 1

    async def _read_ahead(self, key: tuple[str, int, int], ahead: _ReadAhead) -> None:
        """Fetch it, then hold it until its read takes it, ``ahead_secs`` at most."""
        try:
            with ahead.fetching:
                self._keep(ahead, await self._fetch_logged(key, ahead.max_bytes))
            ahead.arrived.set()
            with trio.move_on_after(self.ahead_secs):
                await ahead.let_go.wait()
            if self._ahead.get(key) is ahead:  # not taken in time
                self._came_to("dropped")
        finally:
            ahead.arrived.set()  # (a read waiting for it asks again itself)
            if self._ahead.get(key) is ahead:
                del self._ahead[key]
            self._let_go(ahead)

    async def _fetch_logged(self, key: tuple[str, int, int], max_bytes: int
                            ) -> HistoryRead | None:
        """:meth:`_fetch` in a task of the backend's: whatever it raises is logged, not
        raised into the backend's nursery (None: the read it was for asks again)."""
        try:
            return await self._fetch(*key, max_bytes)
        except Exception as exc:
            log.warning("upstream_read_ahead_failed", topic=key[0], partition=key[1],
                        error=repr(exc))
            return None

    def _keep(self, ahead: _ReadAhead, read: HistoryRead | None) -> None:
        """Hold what arrived, unless its read gave up on it or it would take the bytes
        held past :attr:`max_held_bytes` (then its read asks again itself)."""
        if read is None or ahead.let_go.is_set():
            return
        size = read.size
        if self._held_bytes + size > self.max_held_bytes:
            return
        ahead.read, ahead.size = read, size
        self._held_bytes += size

    def _let_go(self, ahead: _ReadAhead) -> None:
        """Its read took it or gave up on it, or it was dropped: it no longer counts
        against ``read_ahead`` and holds nothing (its task ends at its next turn; a Fetch
        still on its way is cancelled)."""
        if not ahead.let_go.is_set():
            ahead.let_go.set()
            self._running -= 1
        ahead.fetching.cancel()
        self._held_bytes -= ahead.size
        ahead.read, ahead.size = None, 0

    async def _fetch(self, topic: str, partition: int, seq: int, max_bytes: int
                     ) -> HistoryRead:
        offset = seq - 1
        try:
            for wait_ms in (NO_WAIT_MS, NOTHING_YET_WAIT_MS):
                got = await fetch_partition(self._cluster, topic, partition, offset,
                                            max_wait_ms=wait_ms, max_bytes=max_bytes,
                                            after_seq=None, timeout=self.timeout)
                if got.bundles or got.error is not None or got.next_offset != offset \
                        or got.high_watermark <= offset:
                    break
                # Nothing where the leader's watermark says there are records: an answer
                # not allowed to wait came too soon (Tansu under load, at 1 ms). Once more,
                # allowed to wait (a broker answers at once when the records are there).
        except BrokerLost as exc:
            return HistoryRead(error=("NETWORK_EXCEPTION", str(exc)))
        return HistoryRead(got.bundles, got.error, max(got.high_watermark, 0))
