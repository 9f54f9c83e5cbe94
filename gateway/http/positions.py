"""Where a subscriber starts: ``Last-Event-ID`` and ``from=``.

An SSE event's id is the position after it: on a one-partition stream (``?partition=``,
or a topic of one partition) the offset of the event; on a stream of several partitions
``P:OFFSET`` for every partition, comma-separated (``0:41,1:17``), so a reconnecting
EventSource resumes each partition where it stood. A partition missing from the id (the
topic grew) starts at its first message.

A position past a partition's end is 416 ``offset_out_of_range``, as the fetch endpoint
answers an offset past the end: an id naming an offset the partition never had (the topic
was re-created, or the client was handed another stream's id), or ``from=`` an offset
more than one past the end on a one-partition stream. Starting at the end instead would
skip, without a word, the messages the partition has now. An offset older than retention
starts at the first available message. On a stream of several partitions ``from=N``
names no partition: each starts at N, or at its end when it is shorter.

``from=`` (first connection only): ``earliest``, ``latest`` (the default), an offset (the
first offset delivered), or a time (ISO 8601, ``2026-11-25T08:00:00Z``): the first message
at or after it. The fetch endpoint's ``time=`` resolves its time with the same code
(:func:`time_param`, :func:`first_at_time`).
"""

from __future__ import annotations

import re
from datetime import datetime

from gateway.backend.timelookup import find_by_time
from gateway.core.contract import Backend, PartitionInfo
from gateway.http.request import HttpError

#: A time, a space and HH:MM (or HHMM) at the end: a zone whose "+" was not escaped.
_ZONE_AS_SPACE = re.compile(r"^(.*\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?) (\d\d:?\d\d)$")


def _clamp(seq: int, info: PartitionInfo) -> int:
    return min(max(seq, info.first_available, 1), info.high_water_mark + 1)


def _resume_at(seq: int, info: PartitionInfo, partition: int) -> int:
    """``seq`` as a stream's next sequence: 416 past the end, the first available when
    older than retention."""
    if seq > info.high_water_mark + 1:
        raise HttpError(416, "offset_out_of_range", f"partition {partition}: offset "
                        f"{seq - 1} is past the end (last offset {info.high_water_mark})")
    return _clamp(seq, info)


def from_last_event_id(text: str, partitions: list[int], infos: list[PartitionInfo]
                       ) -> dict[int, int]:
    """The next sequence of each partition after the positions ``text`` names; 400 when
    it is not an id this stream gave out, 416 when it names an offset past the end."""
    bad = HttpError(400, "bad_last_event_id", f"Last-Event-ID {text[:80]!r} is not a "
                    "position of this stream (OFFSET, or P:OFFSET,...)")
    text = text.strip()
    if ":" not in text:
        if len(partitions) != 1 or not text.isascii() or not text.isdigit():
            raise bad
        [partition] = partitions
        return {partition: _resume_at(int(text) + 1, infos[partition], partition)}
    named: dict[int, int] = {}
    for part in text.split(","):
        p, _, offset = part.partition(":")
        if not (p.isascii() and p.isdigit() and offset.isascii() and offset.isdigit()):
            raise bad
        named[int(p)] = int(offset)
    if not set(named) <= set(partitions):
        raise bad
    return {p: _resume_at(named[p] + 1, infos[p], p) if p in named else _clamp(1, infos[p])
            for p in partitions}


async def from_parameter(text: str, backend: Backend, topic: str, partitions: list[int],
                         infos: list[PartitionInfo]) -> dict[int, int]:
    """The first sequence of each partition for ``from=text``."""
    if text in ("", "latest"):
        return {p: infos[p].high_water_mark + 1 for p in partitions}
    if text == "earliest":
        return {p: _clamp(1, infos[p]) for p in partitions}
    if text.isascii() and text.isdigit():
        if len(partitions) == 1:
            [p] = partitions
            return {p: _resume_at(max(int(text), 1), infos[p], p)}
        return {p: _clamp(int(text), infos[p]) for p in partitions}
    ms = time_param(text, "from", "earliest, latest, an offset or an ISO 8601 time")
    return {p: await first_at_time(backend, topic, p, ms, infos[p]) for p in partitions}


def time_param(text: str, name: str, expected: str = "an ISO 8601 time") -> int:
    """Milliseconds since the epoch of the ISO 8601 time ``text`` (query parameter
    ``name``, which is ``expected``): 400 when it is not one or has no zone. A zone's
    ``+`` sent unescaped in a query string arrives as a space: it is read as ``+``."""
    text = _ZONE_AS_SPACE.sub(r"\1+\2", text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise HttpError(400, "bad_parameter", f"{name} must be {expected}, "
                        f"got {text[:80]!r}") from None
    if when.tzinfo is None:
        raise HttpError(400, "bad_parameter", f"a {name}= time needs its zone (Z or +HH:MM)")
    return int(when.timestamp() * 1000)


async def first_at_time(backend: Backend, topic: str, partition: int, ms: int,
                        info: PartitionInfo) -> int:
    """The sequence of the first message of ``partition`` at or after ``ms``
    (:func:`~gateway.backend.timelookup.find_by_time`); one past the end when none is."""
    found = await find_by_time(backend, topic, partition, ms, info.first_available,
                               info.high_water_mark)
    return found.seq if found.seq is not None else info.high_water_mark + 1


def event_id(positions: dict[int, int]) -> bytes:
    """The id of a several-partition stream's event: every partition's position."""
    return ",".join(f"{p}:{offset}" for p, offset in positions.items()).encode()
