"""Reads away from the tail: one Fetch from the position asked, not waiting for data.

A reader older than its partition's feed cache, or ahead of the feed, is answered with one
upstream Fetch from its position (:func:`~gateway.backend.kafka.fetcher.fetch_partition`):
Fetch is a stateless request, so no consumer is kept or positioned for it. A read asks
for at most :data:`MAX_READ_BYTES`, whatever the reader asked (it asks again): an answer
of tens of megabytes would come in buffers the C allocator maps afresh, page by page,
for each read, on both sides (over ``gateway.io.allocator.MMAP_THRESHOLD``): a 102 MB
``tank-cli consume``, which asks 64 MiB a read, took 1.0 s through the gateway with
64 MiB Fetches, 0.75-0.85 s with 4 MiB, 0.45-0.5 s with 2 MiB and 0.6 s with 1 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from gateway.backend.kafka.cluster import Cluster
from gateway.backend.kafka.fetcher import NO_WAIT_MS, fetch_partition
from gateway.backend.kafka.wire import BrokerLost
from protocols.kafka.upstream_codec import UpstreamBundle

#: The most one history read asks the upstream for.
MAX_READ_BYTES: Final = 2 * 1024 * 1024
#: The max wait of the second Fetch of a read the first found empty before the watermark.
NOTHING_YET_WAIT_MS: Final = 200


@dataclass(slots=True)
class HistoryRead:
    """What one read found: bundles, or an error (Kafka's name, text); the partition's
    high watermark as the leader told it (0: unknown)."""

    bundles: list[UpstreamBundle] = field(default_factory=list)
    error: tuple[str, str] | None = None
    high_water_mark: int = 0


class HistoryReader:
    """One Fetch per read; see the module doc."""

    def __init__(self, cluster: Cluster, *, timeout: float = 5.0) -> None:
        self._cluster = cluster
        self.timeout = timeout

    async def read(self, topic: str, partition: int, seq: int, max_bytes: int) -> HistoryRead:
        """About ``max_bytes`` of ``topic``/``partition`` from sequence ``seq`` (offset
        ``seq - 1``); :class:`BrokerLost` when the upstream can not be asked."""
        offset = seq - 1
        try:
            for wait_ms in (NO_WAIT_MS, NOTHING_YET_WAIT_MS):
                got = await fetch_partition(self._cluster, topic, partition, offset,
                                            max_wait_ms=wait_ms,
                                            max_bytes=min(max_bytes, MAX_READ_BYTES),
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
