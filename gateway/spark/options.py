"""The options of the figtank data sources, parsed once into plain picklable values.

Spark hands a data source its options in a case-insensitive mapping whose keys are
lower-cased (``startingSequence`` arrives as ``startingsequence``); ``dict(options)``
would keep only the lower-cased keys and a later ``options["startingSequence"]`` would
miss. Here every lookup lower-cases the name asked for and the keys given, so both a
Spark mapping and a plain dict written by hand work, and values keep their case (topic
names are case-sensitive).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.core.config import parse_address
from protocols.tank.bundle import Codec
from protocols.topics import is_valid_topic_name

DEFAULT_ENDPOINT: Final = "127.0.0.1:11011"
#: Messages one Spark task of a batch read covers at most.
DEFAULT_MESSAGES_PER_SPLIT: Final = 250_000
#: Bytes of segment file one Spark task of a ``figtank-segments`` read covers at most.
DEFAULT_BYTES_PER_SPLIT: Final = 16 * 1024 * 1024
DEFAULT_FETCH_BYTES: Final = 4 * 1024 * 1024
DEFAULT_BATCH_MESSAGES: Final = 4096
DEFAULT_BATCH_BYTES: Final = 1024 * 1024
#: The commit topic of an exactly-once streaming write is this prefix, ``-``, the query id.
DEFAULT_COMMIT_TOPIC_PREFIX: Final = "spark-sink"
#: The longest prefix that leaves room for ``-`` and a query id (a 36-character UUID)
#: within a topic name's 64 characters.
MAX_COMMIT_TOPIC_PREFIX: Final = 64 - 37


class OptionError(ValueError):
    """An option is missing or invalid; the message names it as the user spelled it."""


@dataclass(frozen=True, slots=True)
class Position:
    """A place in a partition: ``earliest``, ``latest`` or an explicit sequence number."""

    kind: str  # "earliest" | "latest" | "seq"
    seq: int = 0

    def resolve(self, first_available: int, high_water_mark: int) -> int:
        """The sequence number this position names in a partition with these bounds.

        ``latest`` is one past the last message (the next to be appended); ``earliest``
        is the first available message, or the next one when the partition is empty.
        """
        if self.kind == "latest":
            return high_water_mark + 1
        if self.kind == "earliest":
            return first_available if first_available else high_water_mark + 1
        return self.seq


EARLIEST: Final = Position("earliest")
LATEST: Final = Position("latest")


@dataclass(frozen=True, slots=True)
class Positions:
    """A :class:`Position` per partition, with a default for partitions not named."""

    default: Position
    by_partition: dict[int, Position] = field(default_factory=dict)

    def get(self, partition: int) -> Position:
        return self.by_partition.get(partition, self.default)


class OptionReader:
    """Case-insensitive lookups in a data source's options, with typed parsers."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = {str(k).lower(): v for k, v in options.items()}

    def raw(self, name: str) -> str | None:
        value = self._options.get(name.lower())
        return None if value is None else str(value)

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        return default if value is None or value == "" else value

    def required(self, name: str) -> str:
        value = self.string(name)
        if value is None:
            raise OptionError(f"option {name!r} is required")
        return value

    def integer(self, name: str, default: int, *, minimum: int = 1) -> int:
        value = self.string(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise OptionError(f"option {name!r}: expected an integer, got {value!r}") from None
        if number < minimum:
            raise OptionError(f"option {name!r}: expected at least {minimum}, got {number}")
        return number

    def optional_integer(self, name: str, *, minimum: int = 1) -> int | None:
        return None if self.string(name) is None else self.integer(name, 0, minimum=minimum)

    def number(self, name: str, default: float) -> float:
        value = self.string(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise OptionError(f"option {name!r}: expected a number, got {value!r}") from None
        if number <= 0:
            raise OptionError(f"option {name!r}: expected a number above 0, got {value!r}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self.string(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise OptionError(f"option {name!r}: expected true or false, got {value!r}")

    def topic(self, name: str = "topic", *, required: bool = True) -> str | None:
        value = self.required(name) if required else self.string(name)
        if value is not None and not is_valid_topic_name(value):
            raise OptionError(f"option {name!r}: {value!r} is not a valid topic name "
                              "(1-64 of [A-Za-z0-9_-], not starting or ending with - or _)")
        return value

    def partitions(self, name: str = "partitions") -> tuple[int, ...] | None:
        """``"0,2,5"`` -> ``(0, 2, 5)``; None when not given (every partition)."""
        value = self.string(name)
        if value is None:
            return None
        try:
            parts = tuple(sorted({int(p) for p in value.split(",") if p.strip()}))
        except ValueError:
            raise OptionError(f"option {name!r}: expected partition numbers separated by "
                              f"commas, got {value!r}") from None
        if not parts or parts[0] < 0 or parts[-1] > 0xFFFF:
            raise OptionError(f"option {name!r}: expected partitions in 0..65535, got {value!r}")
        return parts

    def positions(self, name: str, default: Position, *, allow_earliest: bool = True
                  ) -> Positions:
        """``earliest``, ``latest``, a sequence number, or JSON per partition:
        ``{"0": 17, "1": "earliest"}`` (partitions not named get ``default``)."""
        value = self.string(name)
        if value is None:
            return Positions(default)
        text = value.strip()
        if text.startswith("{"):
            try:
                table = json.loads(text)
            except json.JSONDecodeError as exc:
                raise OptionError(f"option {name!r}: bad JSON ({exc})") from None
            if not isinstance(table, dict):
                raise OptionError(f"option {name!r}: expected a JSON object")
            by_partition = {}
            for key, item in table.items():
                try:
                    partition = int(key)
                except ValueError:
                    raise OptionError(f"option {name!r}: {key!r} is not a partition number"
                                      ) from None
                by_partition[partition] = _position(name, item, allow_earliest)
            return Positions(default, by_partition)
        return Positions(_position(name, text, allow_earliest))

    def codec(self, name: str = "compression") -> Codec | None:
        """``auto`` (Tank's rule: Snappy above 512 messages or 1 KiB), ``none``, ``snappy``."""
        value = (self.string(name) or "auto").lower()
        if value == "auto":
            return None
        if value == "none":
            return Codec.NONE
        if value == "snappy":
            return Codec.SNAPPY
        raise OptionError(f"option {name!r}: expected auto, none or snappy, got {value!r}")


def _position(name: str, value: object, allow_earliest: bool) -> Position:
    if isinstance(value, bool):
        raise OptionError(f"option {name!r}: {value!r} is not a position")
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip().lower()
        if text == "latest":
            return LATEST
        if text == "earliest":
            if not allow_earliest:
                raise OptionError(f"option {name!r}: 'earliest' makes no sense here")
            return EARLIEST
        try:
            number = int(text)
        except ValueError:
            raise OptionError(f"option {name!r}: expected earliest, latest or a sequence "
                              f"number, got {value!r}") from None
    if number < 0:
        raise OptionError(f"option {name!r}: a sequence number is >= 0, got {number}")
    return Position("seq", number)


# ------------------------------------------------------------------ parsed option sets


@dataclass(frozen=True, slots=True)
class TankOptions:
    """Options of the ``figtank`` source and sink (see :mod:`gateway.spark`)."""

    host: str
    port: int
    topic: str
    partitions: tuple[int, ...] | None
    starting: Positions
    ending: Positions
    max_messages_per_split: int
    max_messages_per_trigger: int | None
    fail_on_data_loss: bool
    fetch_bytes: int
    request_timeout: float
    client_id: str
    arrow: bool
    batch_messages: int
    batch_bytes: int
    codec: Codec | None
    #: Streaming writes: exactly once (a replayed batch appends nothing twice).
    exactly_once: bool = True
    commit_topic_prefix: str = DEFAULT_COMMIT_TOPIC_PREFIX

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~gateway.client.tank_blocking.BlockingTankClient`."""
        return {"client_id": self.client_id, "request_timeout": self.request_timeout,
                "connect_timeout": min(self.request_timeout, 10.0)}


def tank_options(options: Mapping[str, Any], *, streaming: bool = False) -> TankOptions:
    """Parse the ``figtank`` options; ``streaming`` makes ``latest`` the default start."""
    reader = OptionReader(options)
    endpoint = reader.string("endpoint", DEFAULT_ENDPOINT) or DEFAULT_ENDPOINT
    try:
        host, port = parse_address(endpoint)
    except ValueError as exc:
        raise OptionError(f"option 'endpoint': {exc}") from None
    return TankOptions(
        host=host, port=port,
        topic=reader.topic() or "",
        partitions=reader.partitions(),
        starting=reader.positions("startingSequence", LATEST if streaming else EARLIEST),
        ending=reader.positions("endingSequence", LATEST, allow_earliest=False),
        max_messages_per_split=reader.integer("maxMessagesPerSplit",
                                              DEFAULT_MESSAGES_PER_SPLIT),
        max_messages_per_trigger=reader.optional_integer("maxMessagesPerTrigger"),
        fail_on_data_loss=reader.boolean("failOnDataLoss", True),
        fetch_bytes=reader.integer("fetchBytes", DEFAULT_FETCH_BYTES),
        request_timeout=reader.number("requestTimeout", 60.0),
        client_id=reader.string("clientId", "figtank-spark") or "figtank-spark",
        arrow=reader.boolean("arrow", True),
        batch_messages=reader.integer("batchMessages", DEFAULT_BATCH_MESSAGES),
        batch_bytes=reader.integer("batchBytes", DEFAULT_BATCH_BYTES),
        codec=reader.codec(),
        exactly_once=reader.boolean("exactlyOnce", True),
        commit_topic_prefix=_commit_topic_prefix(reader),
    )


def _commit_topic_prefix(reader: OptionReader) -> str:
    prefix = reader.topic("commitTopicPrefix", required=False) or DEFAULT_COMMIT_TOPIC_PREFIX
    if len(prefix) > MAX_COMMIT_TOPIC_PREFIX:
        raise OptionError(f"option 'commitTopicPrefix': at most {MAX_COMMIT_TOPIC_PREFIX} "
                          f"characters (the query id follows it), got {len(prefix)}")
    return prefix


@dataclass(frozen=True, slots=True)
class SegmentOptions:
    """Options of the ``figtank-segments`` source (see :mod:`gateway.spark.segments`)."""

    path: str
    topic: str | None
    partitions: tuple[int, ...] | None
    starting: Positions
    ending: Positions
    max_bytes_per_split: int
    max_messages_per_split: int
    arrow: bool


def segment_options(options: Mapping[str, Any]) -> SegmentOptions:
    """Parse the ``figtank-segments`` options (``path`` is what ``load(path)`` sets)."""
    reader = OptionReader(options)
    path = reader.string("path") or reader.string("dataDir")
    if path is None:
        raise OptionError("figtank-segments needs the data directory: load(path) or "
                          "option 'dataDir'")
    return SegmentOptions(
        path=path,
        topic=reader.topic(required=False),
        partitions=reader.partitions(),
        starting=reader.positions("startingSequence", EARLIEST),
        ending=reader.positions("endingSequence", LATEST, allow_earliest=False),
        max_bytes_per_split=reader.integer("maxBytesPerSplit", DEFAULT_BYTES_PER_SPLIT),
        max_messages_per_split=reader.integer("maxMessagesPerSplit",
                                              DEFAULT_MESSAGES_PER_SPLIT),
        arrow=reader.boolean("arrow", True),
    )
