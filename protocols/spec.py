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

``versions`` defaults to every version. When a message names a ``versionField``
(Tank's ``client_version``), the version is read from that leading field; otherwise
the caller passes it (Figg carries it in the frame header).

Each message and inline struct becomes a slotted dataclass (``codec.record``); a
field absent from a version decodes to its default. Runs of fixed-width fields
present in the same versions are read and written with one precompiled
``struct.Struct``.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from operator import attrgetter
from typing import Any, Final, Protocol

from protocols.errors import ProtocolError
from protocols.wire import (
    Reader,
    encode_bytes32be,
    encode_bytes32le,
    encode_str8,
    encode_varint,
)

#: The ``struct`` format letter of each fixed-width integer type.
FIXED_FORMATS: Final = {"uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q"}
_FIXED_LIMITS = {
    name: (1 << (8 * struct.calcsize(fmt))) - 1 for name, fmt in FIXED_FORMATS.items()}


@dataclass(frozen=True, slots=True)
class VersionRange:
    """An inclusive range of versions: ``"0+"``, ``"1-3"``, ``"2"``."""

    low: int
    high: int | None  # None: open-ended

    @classmethod
    def parse(cls, text: str | int) -> VersionRange:
        text = str(text).strip()
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


ALL_VERSIONS = VersionRange(0, None)


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
    kind: str  # "request" (to the server) or "response" (to the client)
    valid_versions: VersionRange
    fields: tuple[FieldSpec, ...]
    version_field: str | None = None
    about: str = ""


class CustomType(Protocol):
    """A hand-written codec a declaration refers to by name.

    ``context`` is whatever the caller of :meth:`MessageCodec.decode` passed: for
    example the request a Tank Produce response answers.
    """

    default: Any

    def decode(self, reader: Reader, version: int, context: Any) -> Any: ...

    def encode(self, value: Any, version: int, out: bytearray, context: Any) -> None: ...


def _parse_field(raw: Mapping[str, Any]) -> FieldSpec:
    unknown = set(raw) - {"name", "type", "versions", "count", "fields", "default", "about"}
    if unknown:
        raise ValueError(f"field {raw.get('name')!r}: unknown keys {sorted(unknown)}")
    return FieldSpec(
        name=raw["name"],
        type=raw["type"],
        versions=VersionRange.parse(raw.get("versions", "0+")),
        count=raw.get("count"),
        fields=tuple(_parse_field(f) for f in raw.get("fields", ())),
        default=raw.get("default"),
        about=raw.get("about", ""),
    )


def parse_spec(raw: Mapping[str, Any]) -> MessageSpec:
    """Build a :class:`MessageSpec` from a decoded JSON declaration."""
    kind = raw["type"]
    if kind not in ("request", "response"):
        raise ValueError(f"{raw['name']}: type must be request or response, not {kind!r}")
    return MessageSpec(
        name=raw["name"],
        api_key=int(raw["apiKey"]),
        kind=kind,
        valid_versions=VersionRange.parse(raw["validVersions"]),
        fields=tuple(_parse_field(f) for f in raw["fields"]),
        version_field=raw.get("versionField"),
        about=raw.get("about", ""),
    )


def load_json_with_comments(text: str) -> Any:
    """JSON with whole-line ``//`` comments, as in Kafka's message definitions."""
    lines = (line for line in text.splitlines() if not line.lstrip().startswith("//"))
    return json.loads("\n".join(lines))


# A decode step reads one or more fields and appends their values.
_DecodeStep = Callable[[Reader, int, Any, list], None]
# An encode step writes one or more fields of a record.
_EncodeStep = Callable[[Any, int, bytearray, Any], None]


@dataclass(slots=True)
class _StructCodec:
    """The compiled codec of one message or inline struct."""

    record: type
    decode_steps: list[_DecodeStep] = field(default_factory=list)
    encode_steps: list[_EncodeStep] = field(default_factory=list)
    children: dict[str, _StructCodec] = field(default_factory=dict)

    def decode(self, reader: Reader, version: int, context: Any) -> Any:
        values: list = []
        for step in self.decode_steps:
            step(reader, version, context, values)
        return self.record(*values)

    def encode(self, value: Any, version: int, out: bytearray, context: Any) -> None:
        for step in self.encode_steps:
            step(value, version, out, context)


class TypeRegistry:
    """Primitive codecs for one byte order, plus a protocol's custom types."""

    def __init__(self, byteorder: str, custom: Mapping[str, CustomType] | None = None) -> None:
        if byteorder not in ("little", "big"):
            raise ValueError("byteorder must be 'little' or 'big'")
        self.byteorder = byteorder
        self.prefix = "<" if byteorder == "little" else ">"
        self.custom: dict[str, CustomType] = dict(custom or {})
        little = byteorder == "little"
        self._read_bytes32 = Reader.bytes32le if little else Reader.bytes32be
        self._encode_bytes32 = encode_bytes32le if little else encode_bytes32be

    def fixed(self, type_name: str) -> struct.Struct | None:
        fmt = FIXED_FORMATS.get(type_name)
        return struct.Struct(self.prefix + fmt) if fmt else None

    # -- primitive readers and writers -------------------------------------------------

    def reader_for(self, type_name: str, what: str) -> Callable[[Reader, int, Any], Any]:
        """A function reading one value of a primitive or custom type."""
        fixed = self.fixed(type_name)
        if fixed is not None:
            return lambda r, v, c: r.unpack(fixed, what)[0]
        read_bytes32 = self._read_bytes32
        simple: dict[str, Callable[[Reader, int, Any], Any]] = {
            "varint": lambda r, v, c: r.varint(what),
            "str8": lambda r, v, c: r.str8(what),
            "bytes8": lambda r, v, c: r.bytes8(what),
            "bytes": lambda r, v, c: read_bytes32(r, what),
            "string": lambda r, v, c: _utf8(read_bytes32(r, what), what),
            "varbytes": lambda r, v, c: r.take(r.varint(what), what),
            "rest": lambda r, v, c: r.rest(),
        }
        if type_name in simple:
            return simple[type_name]
        custom = self.custom.get(type_name)
        if custom is None:
            raise ValueError(f"unknown type {type_name!r} in {what}")
        return custom.decode

    def writer_for(self, type_name: str, what: str) -> Callable[[Any, int, bytearray, Any], None]:
        """A function appending one value of a primitive or custom type to ``out``."""
        fixed = self.fixed(type_name)
        if fixed is not None:
            limit = _FIXED_LIMITS[type_name]

            def write_fixed(value: int, v: int, out: bytearray, c: Any) -> None:
                if not 0 <= value <= limit:
                    raise ValueError(f"{what}={value} does not fit {type_name}")
                out += fixed.pack(value)
            return write_fixed
        encode_bytes32 = self._encode_bytes32
        simple: dict[str, Callable[[Any, int, bytearray, Any], None]] = {
            "varint": lambda x, v, out, c: out.extend(encode_varint(x)),
            "str8": lambda x, v, out, c: out.extend(encode_str8(x)),
            "bytes8": lambda x, v, out, c: out.extend(encode_str8(x)),
            "bytes": lambda x, v, out, c: out.extend(encode_bytes32(x)),
            "string": lambda x, v, out, c: out.extend(encode_bytes32(x.encode())),
            "varbytes": lambda x, v, out, c: out.extend(encode_varint(len(x)) + x),
            "rest": lambda x, v, out, c: out.extend(x),
        }
        if type_name in simple:
            return simple[type_name]
        custom = self.custom.get(type_name)
        if custom is None:
            raise ValueError(f"unknown type {type_name!r} in {what}")
        return custom.encode

    def default_for(self, spec: FieldSpec) -> Any:
        if spec.default is not None:
            return spec.default
        if spec.is_array:
            return None  # replaced by a fresh list (see _defaults)
        if spec.type in FIXED_FORMATS or spec.type == "varint":
            return 0
        if spec.type in ("str8", "string"):
            return ""
        if spec.type in ("bytes", "bytes8", "varbytes", "rest"):
            return b""
        custom = self.custom.get(spec.type)
        return None if custom is None else custom.default


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not UTF-8") from exc


def _snake_to_camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


class MessageCodec:
    """Encoder and decoder of one declared message's payload."""

    def __init__(self, spec: MessageSpec, registry: TypeRegistry) -> None:
        self.spec = spec
        self._codec = _compile_struct(spec.name, spec.fields, registry)
        self.record: type = self._codec.record
        if spec.version_field is not None and (
                not spec.fields or spec.fields[0].name != spec.version_field):
            raise ValueError(f"{spec.name}: versionField must be the first field")
        self._version_codec = (
            registry.fixed(spec.fields[0].type) if spec.version_field else None)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def api_key(self) -> int:
        return self.spec.api_key

    def decode(self, payload: bytes | bytearray | memoryview, *, version: int | None = None,
               context: Any = None) -> Any:
        """Decode one whole payload; every byte of it must belong to the message."""
        reader = Reader(payload)
        if self._version_codec is not None:
            if reader.remaining < self._version_codec.size:
                raise ProtocolError(f"{self.spec.name}: payload too short for its version")
            version = self._version_codec.unpack_from(payload, 0)[0]
        elif version is None:
            version = self.spec.valid_versions.low
        if version not in self.spec.valid_versions:
            raise ProtocolError(f"{self.spec.name}: unsupported version {version}")
        record = self._codec.decode(reader, version, context)
        reader.expect_end(self.spec.name)
        return record

    def nested(self, *path: str) -> type:
        """The record class of an inline struct, reached by field names.

        ``produce.nested("topics", "partitions")`` is the class of one partition entry
        of a Produce request.
        """
        codec = self._codec
        for name in path:
            if name not in codec.children:
                raise KeyError(f"{self.spec.name}: no inline struct at {'.'.join(path)}")
            codec = codec.children[name]
        return codec.record

    def encode(self, record: Any, *, version: int | None = None, context: Any = None) -> bytes:
        """Encode a record's payload (no frame header)."""
        if self.spec.version_field is not None:
            version = getattr(record, self.spec.version_field)
        elif version is None:
            version = self.spec.valid_versions.low
        if version not in self.spec.valid_versions:
            raise ValueError(f"{self.spec.name}: unsupported version {version}")
        out = bytearray()
        self._codec.encode(record, version, out, context)
        return bytes(out)


def _compile_struct(name: str, fields: tuple[FieldSpec, ...], registry: TypeRegistry
                    ) -> _StructCodec:
    defaults = [registry.default_for(f) for f in fields]
    record = dataclasses.make_dataclass(
        name,
        [(f.name, Any, _field_default(f, d)) for f, d in zip(fields, defaults, strict=True)],
        slots=True,
        eq=True,
        repr=True,
    )
    record.__doc__ = f"{name}: decoded from and encoded to the wire by its declaration."
    record.__module__ = "protocols.messages"
    codec = _StructCodec(record)
    for group in _group_fields(fields, registry):
        if isinstance(group, list):
            codec.decode_steps.append(_fixed_group_decoder(group, registry, defaults, fields))
            codec.encode_steps.append(_fixed_group_encoder(group, registry))
        else:
            nested = None
            if group.fields:
                nested = _compile_struct(
                    _snake_to_camel(group.element_type), group.fields, registry)
                codec.children[group.name] = nested
            index = fields.index(group)
            codec.decode_steps.append(
                _field_decoder(name, group, registry, defaults[index], nested))
            codec.encode_steps.append(_field_encoder(name, group, registry, nested))
    return codec


def _field_default(spec: FieldSpec, default: Any) -> Any:
    if spec.is_array:
        return dataclasses.field(default_factory=list)
    if isinstance(default, (list, dict, bytearray)):
        return dataclasses.field(default_factory=lambda: type(default)(default))
    return default


def _group_fields(fields: Iterable[FieldSpec], registry: TypeRegistry
                  ) -> list[list[FieldSpec] | FieldSpec]:
    """Runs of fixed-width fields with equal version ranges become one group."""
    groups: list[list[FieldSpec] | FieldSpec] = []
    for spec in fields:
        is_fixed = not spec.is_array and spec.type in FIXED_FORMATS
        if is_fixed and groups and isinstance(groups[-1], list) and \
                groups[-1][0].versions == spec.versions:
            groups[-1].append(spec)
        elif is_fixed:
            groups.append([spec])
        else:
            groups.append(spec)
    return groups


def _fixed_group_decoder(group: list[FieldSpec], registry: TypeRegistry, defaults: list,
                         fields: tuple[FieldSpec, ...]) -> _DecodeStep:
    codec = struct.Struct(registry.prefix + "".join(FIXED_FORMATS[f.type] for f in group))
    what = "/".join(f.name for f in group)
    versions = group[0].versions
    absent = [defaults[fields.index(f)] for f in group]
    size = codec.size

    def decode(reader: Reader, version: int, context: Any, values: list) -> None:
        if version not in versions:
            values.extend(absent)
            return
        pos = reader.pos
        if reader.end - pos < size:
            raise ProtocolError(f"truncated {what}: need {size} bytes at offset {pos}")
        reader.pos = pos + size
        values.extend(codec.unpack_from(reader.buf, pos))

    return decode


def _fixed_group_encoder(group: list[FieldSpec], registry: TypeRegistry) -> _EncodeStep:
    codec = struct.Struct(registry.prefix + "".join(FIXED_FORMATS[f.type] for f in group))
    getter = attrgetter(*(f.name for f in group))
    single = len(group) == 1
    versions = group[0].versions
    names = ", ".join(f.name for f in group)

    def encode(record: Any, version: int, out: bytearray, context: Any) -> None:
        if version not in versions:
            return
        values = getter(record)
        try:
            out += codec.pack(values) if single else codec.pack(*values)
        except struct.error as exc:
            raise ValueError(f"{names}: {exc}") from None

    return encode


def _field_decoder(owner: str, spec: FieldSpec, registry: TypeRegistry, default: Any,
                   nested: _StructCodec | None) -> _DecodeStep:
    what = f"{owner}.{spec.name}"
    versions = spec.versions
    read_one = (nested.decode if nested is not None
                else registry.reader_for(spec.element_type, what))
    if spec.is_array:
        read_one = _array_reader(spec, registry, read_one, what)

    def decode(reader: Reader, version: int, context: Any, values: list) -> None:
        if version not in versions:
            values.append([] if spec.is_array else default)
            return
        values.append(read_one(reader, version, context))

    return decode


def _array_reader(spec: FieldSpec, registry: TypeRegistry,
                  read_element: Callable[[Reader, int, Any], Any], what: str
                  ) -> Callable[[Reader, int, Any], list]:
    count_type = spec.count or "uint32"
    if count_type == "rest":
        def read_until_end(reader: Reader, version: int, context: Any) -> list:
            items = []
            while not reader.at_end():
                items.append(read_element(reader, version, context))
            return items
        return read_until_end
    read_count = registry.reader_for(count_type, f"{what} count")

    def read_array(reader: Reader, version: int, context: Any) -> list:
        count = read_count(reader, version, context)
        # Every element takes at least one byte: a count above what is left is a lie,
        # refused before any list is built for it.
        if count > reader.remaining:
            raise ProtocolError(f"{what}: count {count} exceeds the {reader.remaining} "
                                "bytes left")
        return [read_element(reader, version, context) for _ in range(count)]

    return read_array


def _field_encoder(owner: str, spec: FieldSpec, registry: TypeRegistry,
                   nested: _StructCodec | None) -> _EncodeStep:
    what = f"{owner}.{spec.name}"
    versions = spec.versions
    getter = attrgetter(spec.name)
    write_one: Callable[[Any, int, bytearray, Any], None] = (
        nested.encode if nested is not None else registry.writer_for(spec.element_type, what))
    if spec.is_array:
        count_type = spec.count or "uint32"
        write_count = (None if count_type == "rest"
                       else registry.writer_for(count_type, f"{what} count"))

        def write(value: Any, version: int, out: bytearray, context: Any) -> None:
            if write_count is not None:
                write_count(len(value), version, out, context)
            for item in value:
                write_one(item, version, out, context)
    else:
        write = write_one

    def encode(record: Any, version: int, out: bytearray, context: Any) -> None:
        if version in versions:
            write(getter(record), version, out, context)

    return encode


def load_package_specs(package: str, registry: TypeRegistry) -> dict[str, MessageCodec]:
    """Compile every ``*.json`` declaration in ``package``'s ``specs`` folder."""
    codecs: dict[str, MessageCodec] = {}
    folder = resources.files(package).joinpath("specs")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        spec = parse_spec(load_json_with_comments(entry.read_text(encoding="utf-8")))
        if spec.name in codecs:
            raise ValueError(f"message {spec.name} declared twice")
        codecs[spec.name] = MessageCodec(spec, registry)
    return codecs
