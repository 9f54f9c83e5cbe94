"""Which Kafka codec a Fetch serves compressed data in: ``kafka.fetch_compression`` and
its per-topic override ``kafka.fetch_compression_topics``.

A Tank bundle is stored plain or Snappy (a compressed Kafka batch of any codec becomes a
Snappy bundle: :mod:`protocols.kafka.bundles`). A plain bundle is always served as an
uncompressed batch; a Snappy bundle as a batch in the codec chosen here. Every Kafka client
reads uncompressed and gzip batches; stock kafkajs reads no others, and zstd batches may
only go to a Fetch of version 10 or later (KIP-110: an older client can not know the
codec). A zstd choice therefore answers an older request with gzip, the codec every
client reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from protocols.kafka.batch import Compression
from protocols.kafka.bundles import FetchCodecs, fetch_codecs

__all__ = ["ZSTD_MIN_FETCH_VERSION", "FetchCompression"]

#: The first Fetch version whose response may hold zstd batches (KIP-110).
ZSTD_MIN_FETCH_VERSION: Final = 10
#: What a zstd choice serves to an older Fetch.
_ZSTD_FALLBACK: Final = Compression.GZIP


class FetchCompression:
    """The codecs of each topic's fetched batches: ``default`` for every topic but those
    of ``topics`` (topic name -> codec name: none, gzip, snappy, lz4 or zstd)."""

    __slots__ = ("_default", "_topics")

    def __init__(self, default: str = "none", topics: Mapping[str, str] | None = None
                 ) -> None:
        self._default = self._pair(default)
        self._topics = {name: self._pair(codec) for name, codec in (topics or {}).items()}

    @staticmethod
    def _pair(name: str) -> tuple[FetchCodecs, FetchCodecs]:
        """``(for Fetch v10+, for older)``, made once: a fetch only looks them up."""
        codec = Compression[name.upper()]
        older = _ZSTD_FALLBACK if codec == Compression.ZSTD else codec
        return fetch_codecs(codec), fetch_codecs(older)

    def codecs(self, topic: str, version: int) -> FetchCodecs:
        """The codecs of ``topic``'s batches in a Fetch response of ``version``."""
        pair = self._topics.get(topic, self._default)
        return pair[0] if version >= ZSTD_MIN_FETCH_VERSION else pair[1]
