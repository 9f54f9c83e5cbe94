"""Tank's rules for topic names and partition counts, checked before any path is built."""

from __future__ import annotations

import re
from typing import Final

from gateway.store.errors import InvalidTopicName

#: Tank refuses a topic with more partitions than this.
MAX_PARTITIONS: Final = 65530
MAX_TOPIC_NAME_LEN: Final = 64

# 1-64 of [A-Za-z0-9_-], not starting or ending with '-' or '_'.
_TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}[A-Za-z0-9])?")


def is_valid_topic_name(name: str) -> bool:
    """True when ``name`` follows Tank's topic-name rule."""
    return isinstance(name, str) and _TOPIC_NAME.fullmatch(name) is not None


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
