"""Tank's topic-name rule, shared by both protocols and the store, and what a discovery of
topics reports of each (:class:`TopicInfo`)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

#: Largest number of partitions a Tank topic may have.
MAX_PARTITIONS: Final = 65530

#: Longest topic name.
MAX_NAME_LENGTH: Final = 64
_TOPIC_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}[A-Za-z0-9])?")


def is_valid_topic_name(name: str) -> bool:
    """1-64 characters of ``[A-Za-z0-9_-]``, not starting or ending with ``-`` or ``_``.

    Nothing else can reach a file path: no ``/``, ``.``, ``..`` or NUL.
    """
    # (Longer names are refused before the cache: it keeps short strings only.)
    return isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and _valid_name(name)


@functools.lru_cache(maxsize=1024)  # asked for every produce: the names in use, once each
def _valid_name(name: str) -> bool:
    return _TOPIC_NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as a discovery reports it (Tank's DiscoverTopics, a backend's
    ``discover_topics``): its name, its number of partitions, whether it is enabled."""

    name: str
    partitions: int
    enabled: bool = True
