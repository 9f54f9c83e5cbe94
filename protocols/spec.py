"""Messages declared once as data; codecs derived from the declarations.

A declaration follows the style of Kafka's JSON message definitions: a name, an
id (``apiKey``), the valid versions, and ordered fields, each with a type and the
versions it appears in. Example::

    {
      "name": "ConsumeRequest", "apiKey": 2, "type": "request",
      "validVersions": "0-3", "versionField": "client_version",
      "fields": [
        {"name": "client_version", "type": "uint16"},
        {"name": "flags", "type": "uint8", "versions": "3+"},
        {"name": "topics", "type": "[]ConsumeTopic", "count": "uint8", "fields": [
          {"name": "name", "type": "str8"}
        ]}
      ]
    }

Field types:

- fixed-width integers ``uint8 uint16 uint32 uint64`` in the protocol's byte order;
- ``varint`` (unsigned LEB128);
- ``str8`` (``u8 len | UTF-8``), ``bytes8`` (``u8 len | bytes``);
- ``string`` / ``bytes`` (``u32 len | ...`` in the protocol's byte order);
- ``varbytes`` (``varint len | bytes``), ``rest`` (every byte to the end of the payload);
- ``[]T`` arrays of a primitive or of a struct declared inline with ``fields``;
  ``count`` names the count's type, or ``rest`` for "elements until the payload ends";
- any other name is a *custom type* registered with the :class:`TypeRegistry`:
  the small hand-written codecs for the irregular parts of a protocol.

Kafka's own format (``protocols/kafka/specs/``) adds ``flexibleVersions``,
``nullableVersions``, ``taggedVersions``/``tag``, ``ignorable``, ``entityType`` and
``mapKey``, parsed here into the same :class:`FieldSpec`/:class:`MessageSpec` and compiled
by the generator's Kafka dialect (:mod:`protocols.codegen.kafka`), whose types are
Kafka's (``int16``-length ``string``, ``int32``-length ``bytes``, ...).

``versions`` defaults to every version. When a message names a ``versionField``
(Tank's ``client_version``), the version is read from that leading field; otherwise
the caller passes it (Figg carries it in the frame header).

The declarations are compiled ahead of time: :mod:`protocols.generate` writes each
protocol's record classes (frozen, slotted, typed: :mod:`protocols.record`) and
straight-line codec functions into a checked-in module (``protocols/tank/records.py``,
``protocols/figg/records.py``), as Kafka generates its message classes from its JSON. A
field absent from a version decodes to its default. This module holds what the generator
reads (:func:`parse_spec`, :class:`TypeRegistry`) and what its output calls at run time
(:class:`MessageCodec`, :class:`FlatCodec`, the error helpers).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, Generic, Protocol, TypeVar

from protocols.errors import ProtocolError
from protocols.wire import Reader, decode_varint

#: The ``struct`` format letter of each fixed-width integer type.
FIXED_FORMATS: Final = {"uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q"}
#: Types whose values are ``str`` and ``bytes``.
TEXT_TYPES: Final = frozenset(("str8", "string"))
BYTES_TYPES: Final = frozenset(("bytes8", "bytes", "varbytes", "rest"))
#: Every type the engine knows without a custom codec.
PRIMITIVE_TYPES: Final = frozenset(FIXED_FORMATS) | {"varint"} | TEXT_TYPES | BYTES_TYPES

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive range of versions: ``"0+"``, ``"1-3"``, ``"2"``."""

    low: int
    high: int | None  # None: open-ended

    @classmethod
    def parse(cls, text: str | int) -> VersionRange:
        text = str(text).strip()
        if text == "none":  # Kafka's word for "no version"
            return NO_VERSIONS
        try:
            if text.endswith("+"):
                return cls(int(text[:-1]), None)
            if "-" in text:
                low, high = text.split("-", 1)
                return cls(int(low), int(high))
            return cls(int(text), int(text))
        except ValueError:
            raise ValueError(f"bad version range {text!r}") from None

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version and (
            self.high is None or version <= self.high)

    def covers(self, other: VersionRange) -> bool:
        """True when every version of ``other`` is in this range."""
        return self.low <= other.low and (
            self.high is None or (other.high is not None and other.high <= self.high))

    @property
    def empty(self) -> bool:
        return self.high is not None and self.high < self.low

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.high is None:
            return f"{self.low}+"
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


ALL_VERSIONS = VersionRange(0, None)
NO_VERSIONS = VersionRange(0, -1)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One declared field."""

    name: str
    type: str
    versions: VersionRange = ALL_VERSIONS
    count: str | None = None
    fields: tuple[FieldSpec, ...] = ()
    default: Any = None
    about: str = ""
    # Kafka's message-definition keys (see protocols/kafka/specs/): None where absent.
    nullable_versions: VersionRange | None = None
    tagged_versions: VersionRange | None = None
    tag: int | None = None
    flexible_versions: VersionRange | None = None  # a field's own, overriding the message's
    ignorable: bool = False
    entity_type: str = ""
    map_key: bool = False

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element_type(self) -> str:
        return self.type[2:] if self.is_array else self.type


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """One declared message: what a JSON spec file holds."""

    name: str
    api_key: int
    kind: str  # "request" (to the server), "response" (to the client), or "header" (Kafka)
    valid_versions: VersionRange
    fields: tuple[FieldSpec, ...]
    version_field: str | None = None
    about: str = ""
    comment: str = ""  # the ``//`` lines before the declaration
    #: Kafka: the versions whose strings, bytes and arrays are compact and whose structs
    #: end in tagged fields (None: a protocol without flexible versions).
    flexible_versions: VersionRange | None = None


V = TypeVar("V")


class CustomType(Protocol[V]):
    """A hand-written codec of values of type ``V`` a declaration refers to by name.

    ``context`` is whatever the caller of :meth:`MessageCodec.decode` passed: for
    example the request a Tank Produce response answers. ``annotation`` is the Python type
    of its values as the generated records declare it (names from the module that defines
    the custom type); ``default`` the value of a field absent from a version.
    """

    annotation: str
    default: Any

    def decode(self, reader: Reader, version: int, context: object) -> V: ...

    def encode(self, value: V, version: int, out: bytearray, context: object) -> None: ...


_FIELD_KEYS: Final = frozenset(("name", "type", "versions", "count", "fields", "default",
                                "about"))
#: Keys of Kafka's message definitions (``zeroCopy`` only tells Kafka's Java generator to
#: share buffers: nothing to do here).
_KAFKA_FIELD_KEYS: Final = frozenset(("nullableVersions", "taggedVersions", "tag",
                                      "flexibleVersions", "ignorable", "entityType", "mapKey",
                                      "zeroCopy"))


def _optional_range(raw: Mapping[str, Any], key: str) -> VersionRange | None:
    return VersionRange.parse(raw[key]) if key in raw else None


def _parse_field(raw: Mapping[str, Any]) -> FieldSpec:
    unknown = set(raw) - _FIELD_KEYS - _KAFKA_FIELD_KEYS
    if unknown:
        raise ValueError(f"field {raw.get('name')!r}: unknown keys {sorted(unknown)}")
    tag = raw.get("tag")
    tagged = _optional_range(raw, "taggedVersions")
    if (tag is None) != (tagged is None):
        raise ValueError(f"field {raw['name']!r}: tag and taggedVersions go together")
    return FieldSpec(
        name=raw["name"],
        type=raw["type"],
        versions=VersionRange.parse(raw.get("versions", "0+")),
        count=raw.get("count"),
        fields=tuple(_parse_field(f) for f in raw.get("fields", ())),
        default=raw.get("default"),
        about=raw.get("about", ""),
        nullable_versions=_optional_range(raw, "nullableVersions"),
        tagged_versions=tagged,
        tag=None if tag is None else int(tag),
        flexible_versions=_optional_range(raw, "flexibleVersions"),
        ignorable=bool(raw.get("ignorable", False)),
        entity_type=raw.get("entityType", ""),
        map_key=bool(raw.get("mapKey", False)),
    )


def parse_spec(raw: Mapping[str, Any], comment: str = "") -> MessageSpec:
    """Build a :class:`MessageSpec` from a decoded JSON declaration."""
    kind = raw["type"]
    if kind not in ("request", "response", "header"):
        raise ValueError(f"{raw['name']}: type must be request, response or header, "
                         f"not {kind!r}")
    spec = MessageSpec(
        name=raw["name"],
        api_key=int(raw.get("apiKey", -1)),
        kind=kind,
        valid_versions=VersionRange.parse(raw["validVersions"]),
        fields=tuple(_parse_field(f) for f in raw["fields"]),
        version_field=raw.get("versionField"),
        about=raw.get("about", ""),
        comment=comment,
        flexible_versions=_optional_range(raw, "flexibleVersions"),
    )
    if spec.version_field is not None and (
            not spec.fields or spec.fields[0].name != spec.version_field
            or spec.fields[0].type not in FIXED_FORMATS):
        raise ValueError(f"{spec.name}: versionField must be the first field, fixed-width")
    return spec


def load_json_with_comments(text: str) -> Any:  # noqa: ANN401 (json.loads's value, as it is)
    """JSON with whole-line ``//`` comments, as in Kafka's message definitions."""
    lines = (line for line in text.splitlines() if not line.lstrip().startswith("//"))
    return json.loads("\n".join(lines))


def leading_comment(text: str) -> str:
    """The ``//`` lines before the declaration, without the slashes."""
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("//"):
            break
        lines.append(stripped[2:].strip())
    return "\n".join(lines)


class TypeRegistry:
    """What the generator needs to know besides the declarations: the protocol's byte
    order and its custom types by name."""

    def __init__(self, byteorder: str, custom: Mapping[str, CustomType[Any]] | None = None
                 ) -> None:
        if byteorder not in ("little", "big"):
            raise ValueError("byteorder must be 'little' or 'big'")
        self.byteorder = byteorder
        self.prefix = "<" if byteorder == "little" else ">"
        self.custom: dict[str, CustomType[Any]] = dict(custom or {})

    def check(self, type_name: str, what: str) -> None:
        """Raise ValueError for a type that is neither primitive nor registered."""
        if type_name not in PRIMITIVE_TYPES and type_name not in self.custom:
            raise ValueError(f"unknown type {type_name!r} in {what}")

    def default_for(self, spec: FieldSpec) -> object:
        """The value of a field a version does not carry (arrays: an empty list)."""
        if spec.default is not None:
            return spec.default
        if spec.is_array:
            return []
        if spec.type in FIXED_FORMATS or spec.type == "varint":
            return 0
        if spec.type in TEXT_TYPES:
            return ""
        if spec.type in BYTES_TYPES:
            return b""
        custom = self.custom.get(spec.type)
        return None if custom is None else custom.default


def load_package_codecs(package: str, generated: Mapping[str, PayloadFunctions]
                        ) -> dict[str, MessageCodec[Any]]:
    """The codecs of every declaration in ``package``'s ``specs`` folder, by message name,
    with the record classes and functions generated from them (``PAYLOAD_CODECS`` of the
    package's ``records`` module). ImportError when that module is out of date."""
    specs = load_package_specs(package)
    if set(specs) != set(generated):
        raise ImportError(f"{package}.records does not match specs/: run "
                          f"python -m protocols.generate")
    return {name: MessageCodec(spec, *generated[name]) for name, spec in specs.items()}


def load_package_specs(package: str) -> dict[str, MessageSpec]:
    """Every ``*.json`` declaration in ``package``'s ``specs`` folder, by message name."""
    specs: dict[str, MessageSpec] = {}
    folder = resources.files(package).joinpath("specs")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        text = entry.read_text(encoding="utf-8")
        spec = parse_spec(load_json_with_comments(text), leading_comment(text))
        if spec.name in specs:
            raise ValueError(f"message {spec.name} declared twice")
        specs[spec.name] = spec
    return specs


# -- what the generated codecs use at run time ---------------------------------------------

R = TypeVar("R")


class MessageCodec(Generic[R]):
    """One declared message's payload codec: its declaration, its generated record class
    and generated functions.

    ``decode(payload, version=None, context=None)`` turns one whole payload (no frame
    header) into a record: every byte must belong to the message, bad input raises
    :class:`ProtocolError`. ``encode(record, version=None, context=None)`` is the
    reverse; values that do not fit raise ``ValueError``. A message with a
    ``versionField`` reads and writes its version there; otherwise the caller passes it
    (default: the lowest valid one).
    """

    __slots__ = ("_decode", "_encode", "_nested", "record", "spec")

    def __init__(self, spec: MessageSpec, record: type[R],
                 decode: Callable[[Buffer, int | None, object], R],
                 encode: Callable[[R, int | None, object], bytes],
                 nested: Mapping[str, type] | None = None) -> None:
        self.spec = spec
        self.record = record
        self._decode = decode
        self._encode = encode
        self._nested = dict(nested or {})

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def api_key(self) -> int:
        return self.spec.api_key

    def decode(self, payload: Buffer, *, version: int | None = None,
               context: object = None) -> R:
        """Decode one whole payload; every byte of it must belong to the message."""
        return self._decode(payload, version, context)

    def encode(self, record: R, *, version: int | None = None, context: object = None
               ) -> bytes:
        """Encode a record's payload (no frame header)."""
        return self._encode(record, version, context)

    def nested(self, *path: str) -> type:
        """The record class of an inline struct, reached by field names.

        ``produce.nested("topics", "partitions")`` is the class of one partition entry
        of a Produce request.
        """
        try:
            return self._nested[".".join(path)]
        except KeyError:
            raise KeyError(f"{self.spec.name}: no inline struct at {'.'.join(path)}") from None

    def __repr__(self) -> str:
        return f"<MessageCodec {self.spec.name}>"


#: What a generated module lists for each message: the record class, the payload decoder
#: and encoder, and the record classes of its inline structs by dotted field path.
PayloadFunctions = tuple[type[Any], Callable[[Buffer, int | None, object], Any],
                         Callable[[Any, int | None, object], bytes], dict[str, type[Any]]]


@dataclass(frozen=True, slots=True)
class FlatCodec(Generic[R]):
    """The generated codec of one flat message in a ``type | version | length`` frame.

    - ``decode(payload: bytes) -> record``: the payload must be ``bytes`` (the variable
      fields are slices of it, so never a view of a reused buffer).
    - ``encode_frame(*fields) -> bytes``: the whole frame, header included. ``string``
      fields are passed already UTF-8 encoded, so a caller sending many frames for one
      topic encodes the name once. Values that do not fit raise ``ValueError``.
    - ``encode_record(record) -> bytes``: the same from a record (``str`` strings).
    """

    record: type[R]
    decode: Callable[[bytes], R]
    encode_frame: Callable[..., bytes]
    encode_record: Callable[[R], bytes]


def truncated(what: str, pos: int, end: int) -> ProtocolError:
    return ProtocolError(f"truncated {what}: payload ends {end - pos} bytes after offset {pos}")


def overrun(what: str, length: int, left: int) -> ProtocolError:
    return ProtocolError(f"{what}: length {length} overruns the payload ({left} bytes left)")


def count_overrun(what: str, count: int, left: int) -> ProtocolError:
    # Every element takes at least one byte: a count above what is left is a lie,
    # refused before any list is built for it.
    return ProtocolError(f"{what}: count {count} exceeds the {left} bytes left")


def trailing(what: str, left: int) -> ProtocolError:
    return ProtocolError(f"{left} unexpected trailing bytes in {what}")


def not_utf8(what: str) -> ProtocolError:
    return ProtocolError(f"{what} is not UTF-8")


def read_varint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """``(value, next position)`` of the varint at ``pos``; ProtocolError if cut short."""
    decoded = decode_varint(buf, pos, end)
    if decoded is None:
        raise truncated(what, pos, end)
    return decoded


def cannot_encode(name: str, exc: Exception) -> ValueError:
    return ValueError(f"{name}: {exc}")

