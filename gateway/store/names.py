"""Tank's rules for topic names and partition counts, checked before any path is built.

The rule itself lives in :mod:`protocols.topics` (both protocols use it); this module
turns a breach into the store's :class:`InvalidTopicName`.
"""

from __future__ import annotations

from gateway.store.errors import InvalidTopicName
from protocols.topics import MAX_PARTITIONS, is_valid_topic_name

__all__ = ["MAX_PARTITIONS", "is_valid_topic_name", "validate_partition_count",
           "validate_topic_name"]


def validate_topic_name(name: str) -> str:
    """Return ``name`` unchanged, or raise :class:`InvalidTopicName`.

    Every path the store builds from a topic name goes through here first, so a
    name like ``../x`` or ``.hidden`` never reaches the file system.
    """
    if not is_valid_topic_name(name):
        raise InvalidTopicName(f"invalid topic name {name!r}: 1-64 of [A-Za-z0-9_-], "
                               "not starting or ending with '-' or '_'")
    return name


def validate_partition_count(count: int) -> int:
    """Return ``count`` when 1 <= count <= MAX_PARTITIONS, else raise InvalidTopicName."""
    if not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
        raise InvalidTopicName(f"partition count must be 1..{MAX_PARTITIONS}, got {count!r}")
    return count
