"""Tank's per-topic / per-partition ``config`` files: ``key=value`` lines.

The keys and their defaults are the Tank broker's (Kafka-style names). Sizes
accept Tank's suffixes (``64kb``, ``1gb``, ``2m+512k``), durations too
(``7days``, ``1h+30min``, a bare number is seconds). ``#`` starts a comment.
An unknown key or a bad value raises :class:`InvalidConfig` naming the line.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.store.errors import InvalidConfig

KIB: Final = 1024
MIB: Final = 1024 * KIB
GIB: Final = 1024 * MIB
WEEK_SECS: Final = 7 * 86400


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Settings of a topic's partitions, one field per Tank config key.

    A value of 0 for a retention or flush setting means "no limit" / "never", as in Tank.
    """

    #: ``log.segment.bytes``: roll the active segment before it would grow past this.
    segment_bytes: int = 1 * GIB
    #: ``log.index.interval.bytes``: an index entry when more than this was written since the last.
    index_interval_bytes: int = 4096
    #: ``log.index.size.max.bytes``: roll when the active segment's index would exceed this.
    index_max_bytes: int = 10 * MIB
    #: ``log.retention.secs``: delete rolled segments older than this (0 = keep).
    retention_secs: int = 0
    #: ``log.retention.bytes``: delete the oldest rolled segments while they total more.
    retention_bytes: int = 0
    #: ``retention.segments.count``: keep at most this many rolled segments (0 = all).
    retention_segments: int = 0
    #: ``log.roll.secs``: age limit of the active segment (Tank: one week).
    roll_secs: int = WEEK_SECS
    #: ``log.roll.jitter.secs``: a random amount up to this is taken off ``roll_secs``.
    roll_jitter_secs: int = 0
    #: ``flush.messages``: in ``os`` durability, fsync after this many messages (0 = never).
    flush_messages: int = 0
    #: ``flush.secs``: in ``os`` durability, fsync dirty data older than this (0 = never).
    flush_secs: int = 0
    #: ``log.cleanup.policy``: ``delete`` or ``cleanup`` (compaction: not implemented,
    #: such partitions keep every segment).
    cleanup_policy: str = "delete"
    #: ``log.cleaner.min.cleanable.ratio``: accepted for compatibility, unused.
    cleaner_min_ratio: float = 0.5

    def with_text(self, text: str, bounds: ConfigBounds | None = None) -> TopicConfig:
        """A copy with the keys of a ``key=value`` text applied on top, each checked
        against ``bounds`` when given (:class:`InvalidConfig` otherwise)."""
        values = parse_config(text)
        if bounds is not None:
            bounds.check(values)
        return self.with_values(values)

    def with_keys(self, keys: Mapping[str, object], bounds: ConfigBounds | None = None
                  ) -> TopicConfig:
        """A copy with ``{tank key: value}`` applied (a TOML table of Tank keys)."""
        return self.with_text("\n".join(f"{k}={v}" for k, v in keys.items()), bounds)

    def with_values(self, values: Mapping[str, Any]) -> TopicConfig:
        """A copy with field values (as returned by :func:`parse_config`) applied."""
        return dataclasses.replace(self, **values) if values else self


@dataclass(frozen=True, slots=True)
class ConfigBounds:
    """Minimums for the topic config that clients and operators set (CreateTopic's config
    text, ``topics.config``, the ``config`` files; see :meth:`check`).

    They keep a client from making the store do work per message: Tank rolls a segment
    before an append that would pass ``log.segment.bytes``, so ``log.segment.bytes=64``
    means a new segment, and new descriptors, per produce. The store's own code and its
    tests build :class:`TopicConfig` directly and are not bound by them; :data:`NO_BOUNDS`
    turns them off.
    """

    #: ``log.segment.bytes``: below this, small produces roll a segment each.
    segment_bytes: int = 64 * KIB
    #: ``log.index.interval.bytes``: an index entry per 128 bytes at most.
    index_interval_bytes: int = 128
    #: ``log.index.size.max.bytes``: a full index rolls the segment (512 entries at least).
    index_max_bytes: int = 4 * KIB
    #: ``log.roll.secs``: a segment (and descriptors) per minute at most per partition.
    roll_secs: int = 60

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise :class:`InvalidConfig` naming the key and its minimum when one of
        ``values`` (``{TopicConfig field: value}``, from :func:`parse_config`) is below it."""
        for field_name, key in _BOUNDED.items():
            value = values.get(field_name)
            minimum = getattr(self, field_name)
            if value is not None and value < minimum:
                raise InvalidConfig(f"{key}={value} is below the minimum {minimum}")


    def clamp(self, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``values`` with each one below its minimum raised to it, and what was raised
        (``"key=value -> minimum"``)."""
        kept = dict(values)
        raised = []
        for field_name, key in _BOUNDED.items():
            value = kept.get(field_name)
            minimum = getattr(self, field_name)
            if value is not None and value < minimum:
                kept[field_name] = minimum
                raised.append(f"{key}={value} -> {minimum}")
        return kept, raised


def parse_config_leniently(text: str) -> tuple[dict[str, Any], list[str]]:
    """Like :func:`parse_config`, but a bad line is left out instead of failing the whole
    text: ``(values of the good lines, the problems of the others)``."""
    values: dict[str, Any] = {}
    problems = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        try:
            values.update(parse_config(raw))
        except InvalidConfig as exc:
            problems.append(str(exc).replace("config line 1", f"config line {lineno}", 1))
    return values, problems


#: The Tank key of each field :class:`ConfigBounds` bounds.
_BOUNDED: Final = {"segment_bytes": "log.segment.bytes",
                   "index_interval_bytes": "log.index.interval.bytes",
                   "index_max_bytes": "log.index.size.max.bytes",
                   "roll_secs": "log.roll.secs"}

#: No minimums beyond what the parser itself requires (tests that force small segments).
NO_BOUNDS: Final = ConfigBounds(segment_bytes=0, index_interval_bytes=0, index_max_bytes=0,
                                roll_secs=0)


_DURATION_UNITS: Final = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": WEEK_SECS, "week": WEEK_SECS, "weeks": WEEK_SECS,
    "mon": 30 * 86400, "month": 30 * 86400, "months": 30 * 86400,
    "y": 365 * 86400, "year": 365 * 86400, "years": 365 * 86400,
}
_SIZE_UNITS: Final = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": KIB, "kb": KIB, "kbs": KIB, "kilobyte": KIB, "kilobytes": KIB,
    "m": MIB, "mb": MIB, "mbs": MIB, "megabyte": MIB, "megabytes": MIB,
    "g": GIB, "gb": GIB, "gbs": GIB, "gigabyte": GIB, "gigabytes": GIB,
    "t": 1024 * GIB, "tb": 1024 * GIB, "tbs": 1024 * GIB, "terabyte": 1024 * GIB,
    "terabytes": 1024 * GIB,
}
_TERM: Final = re.compile(r"\s*(\d+)\s*([a-z]*)\s*([,+]?)")


def _parse_sum(text: str, units: Mapping[str, int], what: str) -> int:
    total = 0
    pos = 0
    lowered = text.lower()
    if not lowered.strip():
        raise ValueError(f"empty {what}")
    while pos < len(lowered):
        match = _TERM.match(lowered, pos)
        if match is None or match.group(2) not in units:
            raise ValueError(f"cannot parse {what} {text!r}")
        total += int(match.group(1)) * units[match.group(2)]
        pos = match.end()
    return total


def parse_size(text: str) -> int:
    """Bytes from Tank's size syntax (``4096``, ``64kb``, ``1g+512m``)."""
    return _parse_sum(text, _SIZE_UNITS, "size")


def parse_duration(text: str) -> int:
    """Seconds from Tank's duration syntax (``3600``, ``7days``, ``1h+30min``)."""
    return _parse_sum(text, _DURATION_UNITS, "duration")


def _count(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"not a non-negative integer: {text!r}")
    return int(text)


def _policy(text: str) -> str:
    value = text.lower()
    if value not in ("delete", "cleanup"):
        raise ValueError("log.cleanup.policy must be delete or cleanup")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be between 0 and 1")
    return value


def _at_least(minimum: int, *, zero_ok: bool = False) -> Callable[[int], bool]:
    return lambda v: (zero_ok and v == 0) or v >= minimum


# key -> (field, parser, validity check, description of the valid range)
_KEYS: Final[dict[str, tuple[str, Callable[[str], Any], Callable[[Any], bool], str]]] = {
    "log.segment.bytes": ("segment_bytes", parse_size, _at_least(64), ">= 64"),
    "log.index.interval.bytes": ("index_interval_bytes", parse_size, _at_least(128), ">= 128"),
    "log.index.size.max.bytes": ("index_max_bytes", parse_size, _at_least(128), ">= 128"),
    "log.retention.secs": ("retention_secs", parse_duration, _at_least(0), ">= 0"),
    "log.retention.bytes": ("retention_bytes", parse_size, _at_least(128, zero_ok=True),
                            "0 or >= 128"),
    "retention.segments.count": ("retention_segments", _count, _at_least(2, zero_ok=True),
                                 "0 or >= 2"),
    "log.roll.secs": ("roll_secs", parse_duration, _at_least(1), ">= 1"),
    "log.roll.jitter.secs": ("roll_jitter_secs", parse_duration, _at_least(0), ">= 0"),
    "flush.messages": ("flush_messages", _count, _at_least(0), ">= 0"),
    "flush.secs": ("flush_secs", parse_duration, _at_least(0), ">= 0"),
    "log.cleanup.policy": ("cleanup_policy", _policy, lambda v: True, "delete or cleanup"),
    "log.cleaner.min.cleanable.ratio": ("cleaner_min_ratio", _ratio, lambda v: True,
                                        "0..1"),
}

#: The config keys the store understands (Tank's names).
CONFIG_KEYS: Final = tuple(_KEYS)


def parse_config(text: str) -> dict[str, Any]:
    """Parse ``key=value`` lines into ``{TopicConfig field: value}``.

    Keys are case-insensitive; whitespace around keys and values is ignored;
    ``#`` starts a comment. Raises :class:`InvalidConfig` for an unknown key,
    a line without ``=``, an empty or over-long (> 128) value, or a value out of range.
    """
    values: dict[str, Any] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        value = value.strip()
        if not sep or not key:
            raise InvalidConfig(f"config line {lineno}: expected key=value, got {raw!r}")
        if key not in _KEYS:
            raise InvalidConfig(f"config line {lineno}: unknown key {key!r}")
        try:
            field, parsed = parse_value(key, value)
        except InvalidConfig as exc:
            raise InvalidConfig(f"config line {lineno}: {key}: {exc}") from None
        values[field] = parsed
    return values


def parse_value(key: str, value: str) -> tuple[str, Any]:
    """``(TopicConfig field, parsed value)`` of a known Tank config key (lower case, one of
    :data:`CONFIG_KEYS`) and its value; raises :class:`InvalidConfig` saying what is wrong
    with the value (the caller names the key)."""
    field, parser, valid, allowed = _KEYS[key]
    if not 1 <= len(value) <= 128:
        raise InvalidConfig("needs a value of 1-128 characters")
    try:
        parsed = parser(value)
    except ValueError as exc:
        raise InvalidConfig(str(exc)) from None
    if not valid(parsed):
        raise InvalidConfig(f"{value} is out of range ({allowed})")
    return field, parsed
