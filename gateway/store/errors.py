"""Errors the log store raises to its callers.

They say what went wrong in store terms; the backend (:mod:`gateway.backend.embedded`) maps
them to each protocol's codes.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class InvalidTopicName(StoreError):
    """A topic name breaks Tank's rule, or a partition count is out of range."""


class InvalidConfig(StoreError):
    """A topic/partition ``config`` text has an unknown key or a bad value."""


class LimitReached(StoreError):
    """A creation refused because it would pass a resource limit; ``limit`` is the
    limit's setting name (``max_topics``, ``max_partitions``, ``open_files``)."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class TopicExists(StoreError):
    """CreateTopic for a topic that already exists."""


class UnknownTopic(StoreError):
    """No topic by that name."""


class UnknownPartition(StoreError):
    """The topic exists but has no such partition."""


class InvalidSequence(StoreError):
    """A sparse bundle or an explicit base sequence at or below the high-water mark."""


class InvalidBundle(StoreError):
    """The bytes are not a valid Tank bundle (bad header, framing or Snappy data)."""


class BundleTooLarge(StoreError):
    """A bundle over the configured ``max_bundle_size``."""


class StoreIOError(StoreError):
    """A write, fsync or read failed (disk full, I/O error); nothing partial is visible.

    ``kind`` says what kind of fault it is, as the protocols answer it: ``no_space`` (the
    disk is full, or the free-space floor refused the write), ``read_only`` (the
    filesystem is mounted read-only) or ``io_error`` (anything else: EIO, a failed fsync).
    """

    def __init__(self, message: str, kind: str = "io_error") -> None:
        super().__init__(message)
        self.kind = kind


class DiskFull(StoreIOError):
    """A write refused before the filesystem would have: it would leave less free than
    the floor the store keeps (``store.min_free_bytes``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "no_space")


class SegmentCheckPending(StoreError):
    """A read needs a rolled segment that is being checked for damage in a worker thread
    (the first read of a big one); ``await partition.wait_checks()``, then read again."""


class StoreClosed(StoreError):
    """The store (or the partition) is closed."""


class OutOfRange(StoreError):
    """A read below the first available sequence number or above high-water mark + 1.

    Tank answers this with the boundary error (0x01) carrying ``first_available``.
    """

    def __init__(self, seq: int, first_available: int, high_water_mark: int) -> None:
        super().__init__(f"sequence {seq} outside [{first_available}, {high_water_mark + 1}]")
        self.seq = seq
        self.first_available = first_available
        self.high_water_mark = high_water_mark
