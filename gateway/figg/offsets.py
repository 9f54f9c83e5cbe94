"""Figg topics and offsets <-> Tank (topic, partition, sequence number).

A Figg topic ``name`` is Tank topic ``name``, partition 0; ``name/3`` is partition 3.
A Figg offset is the Tank sequence number of the message it names: DATA for the
message with sequence ``s`` carries offset ``s``, and ATTACH with offset X resumes
at sequence X + 1. A Figg subscriber and a Tank consumer can therefore hand
positions to each other unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocols.figg.messages import ATTACH_FROM_OFFSET
from protocols.topics import MAX_PARTITIONS, is_valid_topic_name

__all__ = [
    "AttachStart", "InvalidTopic", "TankPartition", "attach_start", "figg_to_tank",
    "tank_to_figg",
]


class InvalidTopic(ValueError):
    """A Figg topic that maps to no valid Tank (topic, partition)."""


@dataclass(frozen=True, slots=True)
class TankPartition:
    """Where a Figg topic lives in the shared log."""

    topic: str
    partition: int


def figg_to_tank(figg_topic: str) -> TankPartition:
    """``"orders"`` -> (orders, 0); ``"orders/3"`` -> (orders, 3)."""
    name, sep, partition_text = figg_topic.partition("/")
    partition = 0
    if sep:
        if not partition_text.isascii() or not partition_text.isdigit() or (
                len(partition_text) > 1 and partition_text[0] == "0"):
            raise InvalidTopic(f"bad partition in Figg topic {figg_topic!r}")
        partition = int(partition_text)
        if partition >= MAX_PARTITIONS:
            raise InvalidTopic(f"partition {partition} out of range in {figg_topic!r}")
    if not is_valid_topic_name(name):
        raise InvalidTopic(f"invalid topic name {name!r}")
    return TankPartition(name, partition)


def tank_to_figg(topic: str, partition: int) -> str:
    """The Figg topic naming a Tank (topic, partition): partition 0 has no suffix."""
    return topic if partition == 0 else f"{topic}/{partition}"


@dataclass(frozen=True, slots=True)
class AttachStart:
    """Where a subscription starts: the first sequence it delivers, and the offset
    ATTACHED reports (the position "after which" delivery starts)."""

    first_seq: int

    @property
    def attached_offset(self) -> int:
        return self.first_seq - 1


def attach_start(flags: int, offset: int, first_available: int, high_water_mark: int
                 ) -> AttachStart:
    """Apply the ATTACH offset rules to a partition's current bounds.

    - no resume flag: start after the high-water mark (live messages only);
    - flag with offset 0: replay from the first available message;
    - flag with offset X: resume at X + 1, clamped into
      ``[first_available, high_water_mark + 1]`` (expired or future offsets).
    """
    tail = high_water_mark + 1
    # Tank reports a partition that never held a message as (0, 0): sequences start at 1.
    first_available = max(first_available, 1)
    if not flags & ATTACH_FROM_OFFSET:
        return AttachStart(tail)
    if offset == 0:
        return AttachStart(min(first_available, tail))
    wanted = offset + 1 if offset < tail else tail
    return AttachStart(max(min(wanted, tail), min(first_available, tail)))
