"""Errors the log store raises to its callers.

Each carries ``tank_code``: the Tank error code a listener should answer with
for the request that failed (a Produce per-partition code, or a CreateTopic
code), or ``None`` when the protocol has no code for it.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""

    tank_code: int | None = None


class InvalidTopicName(StoreError):
    """A topic name breaks Tank's rule, or a partition count is out of range."""

    tank_code = 10


class InvalidConfig(StoreError):
    """A topic/partition ``config`` text has an unknown key or a bad value."""

    tank_code = 4


class TopicExists(StoreError):
    """CreateTopic for a topic that already exists."""

    tank_code = 1


class UnknownTopic(StoreError):
    """No topic by that name."""

    tank_code = 0xFF


class UnknownPartition(StoreError):
    """The topic exists but has no such partition."""

    tank_code = 1


class InvalidSequence(StoreError):
    """A sparse bundle or an explicit base sequence at or below the high-water mark."""

    tank_code = 10


class InvalidBundle(StoreError):
    """The bytes are not a valid Tank bundle (bad header, framing or Snappy data)."""

    tank_code = 2


class BundleTooLarge(StoreError):
    """A bundle over the configured ``max_bundle_size``."""

    tank_code = 2


class StoreIOError(StoreError):
    """A write, fsync or read failed (disk full, I/O error); nothing partial is visible."""

    tank_code = 2


class StoreClosed(StoreError):
    """The store (or the partition) is closed."""

    tank_code = 2


class OutOfRange(StoreError):
    """A read below the first available sequence number or above high-water mark + 1.

    Tank answers this with the boundary error (0x01) carrying ``first_available``.
    """

    tank_code = 1

    def __init__(self, seq: int, first_available: int, high_water_mark: int) -> None:
        super().__init__(f"sequence {seq} outside [{first_available}, {high_water_mark + 1}]")
        self.seq = seq
        self.first_available = first_available
        self.high_water_mark = high_water_mark
