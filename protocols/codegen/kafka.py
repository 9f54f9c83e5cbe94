"""The Kafka dialect of the generator: codecs for declarations in Kafka's own format.

Kafka's message definitions (``protocols/kafka/specs/*.json``) use Kafka's type system:
``int8 int16 uint16 int32 uint32 int64 float64 bool uuid`` (fixed width, big-endian),
``string`` (``int16 len``), ``bytes`` and ``records`` (``int32 len``), ``[]T`` arrays
(``int32 count``) of a primitive or of a struct declared inline with ``fields``, and a
struct field (a type name with ``fields``). ``nullableVersions`` lets strings, bytes,
records and arrays be null (length ``-1``). In the message's ``flexibleVersions`` strings,
bytes and arrays are *compact* (unsigned varint ``len + 1``, ``0`` for null; a field's own
``flexibleVersions`` overrides, as the request header's client id does) and every struct
ends in a tagged-field section: fields with ``tag``/``taggedVersions`` travel there, only
when they differ from their ``default``; unknown tags are skipped. Writing a record with a
non-default value in a field its version lacks raises ``ValueError`` unless the field is
``ignorable``, as Kafka does.

Field names are CamelCase in the declarations (as Kafka writes them) and snake_case in the
records (``ThrottleTimeMs`` -> ``throttle_time_ms``). uuids are 16 raw bytes. Every struct
gets a decoder and an encoder function; a message's codec calls its root struct's with
``flexible`` worked out once from the version.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Final

from protocols.codegen.core import Module, RecordStruct, Target, check_name, docstring, snake
from protocols.spec import FieldSpec, MessageSpec, VersionRange

#: The ``struct`` format of each fixed-width Kafka type.
FIXED: Final = {"int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
                "int64": "q", "float64": "d", "bool": "?", "uuid": "16s"}
VARIABLE: Final = frozenset(("string", "bytes", "records"))
_ANNOTATIONS: Final = {"float64": "float", "bool": "bool", "uuid": "bytes", "string": "str",
                       "bytes": "bytes", "records": "bytes | bytearray | memoryview"}


def _test(versions: VersionRange | None, var: str = "version") -> str:
    """A Python expression true for the versions of ``versions`` (``False`` for none)."""
    if versions is None or versions.empty:
        return "False"
    if versions.high is not None and versions.low == versions.high:
        return f"{var} == {versions.low}"
    tests = []
    if versions.low > 0:
        tests.append(f"{var} >= {versions.low}")
    if versions.high is not None:
        tests.append(f"{var} <= {versions.high}")
    return " and ".join(tests) or "True"


def _regular(f: FieldSpec) -> VersionRange:
    """The versions in which ``f`` is a regular (not tagged) field."""
    if f.tagged_versions is None:
        return f.versions
    if f.tagged_versions.high is not None:
        raise ValueError(f"{f.name}: taggedVersions must be open-ended")
    if f.versions.low >= f.tagged_versions.low:
        return VersionRange(0, -1)
    high = f.tagged_versions.low - 1
    if f.versions.high is not None:
        high = min(high, f.versions.high)
    return VersionRange(f.versions.low, high)


def _tagged(f: FieldSpec) -> VersionRange | None:
    """The versions in which ``f`` travels in the tagged section (None: never)."""
    if f.tagged_versions is None:
        return None
    low = max(f.versions.low, f.tagged_versions.low)
    return VersionRange(low, f.versions.high)


def _differs(value: str, default: str) -> str:
    if default == "None":
        return f"{value} is not None"
    if default in ("False", "True"):
        return value if default == "False" else f"not {value}"
    return f"{value} != {default}"


def _snake_fields(fields: tuple[FieldSpec, ...]) -> tuple[FieldSpec, ...]:
    return tuple(dataclasses.replace(f, name=snake(f.name), fields=_snake_fields(f.fields))
                 for f in fields)


def _group_key(f: FieldSpec) -> tuple[VersionRange, VersionRange | None]:
    return (f.versions, f.tagged_versions)


class KafkaModule(Module):
    """The source of ``protocols/kafka/records.py``."""

    def __init__(self, target: Target, specs: Sequence[MessageSpec]) -> None:
        specs = [dataclasses.replace(s, fields=_snake_fields(s.fields)) for s in specs]
        super().__init__(target, specs)
        self.helpers: set[str] = set()
        self.struct_owner: dict[str, str] = {}  # struct class -> the message declaring it

    def helper(self, name: str) -> str:
        self.helpers.add(name)
        return name

    # -- types ----------------------------------------------------------------------------

    def annotation(self, spec: FieldSpec, owner: str) -> str:
        element = spec.element_type
        if spec.fields:
            text = element
        elif element in FIXED or element in VARIABLE:
            text = _ANNOTATIONS.get(element, "int")
        else:
            raise ValueError(f"unknown type {element!r} in {owner}.{spec.name}")
        if spec.is_array:
            text = f"list[{text}]"
        if spec.nullable_versions is not None and not spec.nullable_versions.empty:
            if not (spec.is_array or element in VARIABLE):
                raise ValueError(f"{owner}.{spec.name}: only strings, bytes, records and "
                                 f"arrays are nullable")
            text += " | None"
        return text

    def default(self, spec: FieldSpec) -> str:
        """Source of the field's default: a literal, or for a list or a struct an expression
        evaluated for each record (``[]``, ``Type()``), never one shared object."""
        return repr(self.default_value(spec)) if not (spec.fields or spec.is_array) else (
            self._composite_default(spec))

    def _composite_default(self, spec: FieldSpec) -> str:
        if spec.default not in (None, "null"):
            raise ValueError(f"{spec.name}: arrays and structs take no custom default")
        if spec.default == "null":
            return "None"
        if spec.is_array:
            return "[]"
        return f"{spec.type}()"

    @staticmethod
    def default_value(spec: FieldSpec) -> object:
        """The Python value of a primitive field's default (Kafka's rules)."""
        raw = spec.default
        kind = spec.type
        if isinstance(raw, str) and raw == "null":
            if spec.nullable_versions is None:
                raise ValueError(f"{spec.name}: default null on a field never nullable")
            return None
        if kind == "bool":
            return raw in (True, "true")
        if kind == "float64":
            return float(raw or 0)
        if kind in FIXED and kind != "uuid":
            value = int(str(raw), 0) if raw is not None else 0
            try:
                struct.pack(">" + FIXED[kind], value)
            except struct.error:
                raise ValueError(f"{spec.name}: default {raw!r} out of range for {kind}"
                                 ) from None
            return value
        if kind == "string":
            return "" if raw is None else str(raw)
        if raw is not None:
            raise ValueError(f"{spec.name}: a {kind} field takes no custom default")
        if kind == "uuid":
            return bytes(16)
        return None if kind == "records" else b""

    # -- record classes -------------------------------------------------------------------

    def record_classes(self, spec: MessageSpec) -> list[RecordStruct]:
        found: list[RecordStruct] = []

        def walk(name: str, fields: tuple[FieldSpec, ...], doc: str, path: str) -> None:
            if name in self.struct_owner:
                raise ValueError(f"struct {name} declared in both {self.struct_owner[name]} "
                                 f"and {spec.name}")
            self.struct_owner[name] = spec.name
            tags: set[int] = set()
            for f in fields:
                check_name(name, f.name)
                self.annotation(f, name)
                if f.tag is not None:
                    if f.tag in tags:
                        raise ValueError(f"{name}: tag {f.tag} used twice")
                    tags.add(f.tag)
                if f.fields:
                    walk(f.element_type, f.fields, f"One element of ``{name}.{f.name}``."
                         if f.is_array else f"``{name}.{f.name}``.",
                         f"{path}.{f.name}".lstrip("."))
            found.append(RecordStruct(name, fields, doc, path))

        doc = spec.about or spec.comment or f"The {spec.name} message."
        walk(spec.name, spec.fields, doc, "")
        return found

    def emit_record(self, rec: RecordStruct) -> None:
        super().emit_record(rec)
        self.emit_struct_decoder(rec)
        self.emit_struct_encoder(rec)

    # -- decoders -------------------------------------------------------------------------

    def emit_struct_decoder(self, rec: RecordStruct) -> None:
        lines = [f"def _decode_{rec.name}(buf: bytes, pos: int, end: int, version: int, "
                 f"flexible: bool) -> tuple[{rec.name}, int]:"]
        body: list[str] = []
        fields = rec.fields
        i = 0
        while i < len(fields):
            f = fields[i]
            regular = _regular(f)
            group = [f]
            if f.type in FIXED:
                while (i + len(group) < len(fields)
                       and fields[i + len(group)].type in FIXED
                       and _group_key(fields[i + len(group)]) == _group_key(f)):
                    group.append(fields[i + len(group)])
            test = _test(regular)
            if test == "False":
                read: list[str] = []
            elif len(group) > 1:
                read = self.read_fixed_group(rec.name, group)
            else:
                read = self.read_value(rec.name, f, f"{f.name}_", "end")
            if test == "True":
                body += read
            elif test == "False":
                body += [f"{g.name}_: {self.annotation(g, rec.name)} = {self.default(g)}"
                         for g in group]
            else:
                body += [f"if {test}:", *("    " + line for line in read), "else:",
                         *(f"    {g.name}_ = {self.default(g)}" for g in group)]
            i += len(group)
        tagged = sorted((f for f in fields if f.tag is not None), key=lambda f: f.tag or 0)
        what = f"{rec.name} tagged fields"
        if not tagged:
            body += ["if flexible:",
                     f"    pos = {self.helper('skip_tagged')}(buf, pos, end, {what!r})"]
        else:
            body += ["if flexible:",
                     f"    ntags, pos = {self.helper('read_uvarint')}(buf, pos, end, {what!r})",
                     "    for _ in range(ntags):",
                     f"        tag, stop, pos = {self.helper('read_tag_header')}"
                     f"(buf, pos, end, {what!r})"]
            keyword = "if"
            for f in tagged:
                read = self.read_value(rec.name, f, f"{f.name}_", "stop")
                body += [f"        {keyword} tag == {f.tag} and {_test(_tagged(f))}:",
                         *("            " + line for line in read),
                         "            if pos != stop:",
                         f"                raise ProtocolError('{rec.name}.{f.name}: tagged "
                         "value of the wrong size')"]
                keyword = "elif"
            body.append("        pos = stop")
        names = ", ".join(f"{f.name}_" for f in fields)
        body += [f"result = _{rec.name}Builder({names})", f"result.__class__ = {rec.name}",
                 "return result, pos"]
        self.codecs.append("\n".join(lines + ["    " + line for line in body]))

    def read_fixed_group(self, owner: str, group: list[FieldSpec]) -> list[str]:
        fmt = "".join(FIXED[g.type] for g in group)
        size = struct.calcsize(">" + fmt)
        self.spec_imports.add("truncated")
        what = f"{owner}.{'/'.join(g.name for g in group)}"
        return [f"if end - pos < {size}:", f"    raise truncated({what!r}, pos, end)",
                f"{', '.join(g.name + '_' for g in group)} = "
                f"{self.struct(fmt)}.unpack_from(buf, pos)", f"pos += {size}"]

    @staticmethod
    def _flexible(f: FieldSpec) -> str:
        return "flexible" if f.flexible_versions is None else _test(f.flexible_versions)

    def read_value(self, owner: str, f: FieldSpec, var: str, end: str) -> list[str]:
        """Lines reading ``f``'s value into ``var``, not past ``end``."""
        what = f"{owner}.{f.name}"
        flexible = self._flexible(f)
        nullable = _test(f.nullable_versions)
        if f.is_array:
            count = f"n_{f.name}"
            item = f"item_{f.name}"
            if f.fields:
                element = [f"{item}, pos = _decode_{f.element_type}(buf, pos, {end}, version, "
                           "flexible)"]
            else:
                element = self.read_primitive(f.element_type, item, what + " element", end,
                                              flexible, "False")
            loop = [f"{var} = []", f"for _ in range({count}):",
                    *("    " + line for line in element), f"    {var}.append({item})"]
            head = [f"{count}, pos = {self.helper('read_count')}(buf, pos, {end}, {flexible}, "
                    f"{nullable}, {what!r})"]
            if nullable == "False":
                return head + loop
            return [*head, f"if {count} < 0:", f"    {var} = None", "else:",
                    *("    " + line for line in loop)]
        if f.fields:
            return [f"{var}, pos = _decode_{f.type}(buf, pos, {end}, version, flexible)"]
        return self.read_primitive(f.type, var, what, end, flexible, nullable)

    def read_primitive(self, kind: str, var: str, what: str, end: str, flexible: str,
                       nullable: str) -> list[str]:
        if kind in FIXED:
            fmt = FIXED[kind]
            size = struct.calcsize(">" + fmt)
            self.spec_imports.add("truncated")
            read = (f"{var} = {self.struct(fmt)}.unpack_from(buf, pos)[0]")
            return [f"if {end} - pos < {size}:", f"    raise truncated({what!r}, pos, {end})",
                    read, f"pos += {size}"]
        helper = {"string": "read_string", "records": "read_records"}.get(kind, "read_bytes")
        if nullable == "False":
            return [f"{var}, pos = {self.helper(helper)}(buf, pos, {end}, {flexible}, "
                    f"{what!r})"]
        helper = helper.replace("read_", "read_nullable_")
        return [f"{var}, pos = {self.helper(helper)}(buf, pos, {end}, {flexible}, {nullable}, "
                f"{what!r})"]

    # -- encoders -------------------------------------------------------------------------

    def emit_struct_encoder(self, rec: RecordStruct) -> None:
        lines = [f"def _encode_{rec.name}(record: {rec.name}, out: bytearray, version: int, "
                 "flexible: bool) -> None:"]
        body: list[str] = []
        fields = rec.fields
        i = 0
        while i < len(fields):
            f = fields[i]
            group = [f]
            if f.type in FIXED:
                while (i + len(group) < len(fields)
                       and fields[i + len(group)].type in FIXED
                       and _group_key(fields[i + len(group)]) == _group_key(f)):
                    group.append(fields[i + len(group)])
            test = _test(_regular(f))
            if len(group) > 1:
                fmt = "".join(FIXED[g.type] for g in group)
                write = [f"out += {self.struct(fmt)}.pack("
                         f"{', '.join('record.' + g.name for g in group)})"]
            else:
                write = self.write_value(rec.name, f, f"record.{f.name}", "out")
            unset = [g for g in group if not g.ignorable and g.tag is None]
            check = " or ".join(_differs(f"record.{g.name}", self.default(g)) for g in unset)
            refuse = f"    raise {self.helper('not_in_version')}" \
                     f"('{rec.name}.{'/'.join(g.name for g in unset)}', version)"
            if test == "True":
                body += write
            elif test == "False":
                pass
            else:
                body += [f"if {test}:", *("    " + line for line in write)]
                if check:
                    body += [f"elif {check}:", refuse]
            i += len(group)
        tagged = sorted((f for f in fields if f.tag is not None), key=lambda f: f.tag or 0)
        if not tagged:
            body += ["if flexible:", "    out.append(0)"]
        else:
            body += ["if flexible:", "    tagged: list[tuple[int, bytearray]] = []"]
            for f in tagged:
                differs = _differs(f"record.{f.name}", self.default(f))
                body += [f"    if {_test(_tagged(f))} and {differs}:",
                         "        value = bytearray()",
                         *("        " + line
                           for line in self.write_value(rec.name, f, f"record.{f.name}",
                                                        "value")),
                         f"        tagged.append(({f.tag}, value))"]
            body.append(f"    {self.helper('write_tagged')}(out, tagged)")
        self.codecs.append("\n".join(lines + ["    " + line for line in body]))

    def write_value(self, owner: str, f: FieldSpec, value: str, out: str) -> list[str]:
        what = f"{owner}.{f.name}"
        flexible = self._flexible(f)
        nullable = _test(f.nullable_versions)
        guard = []
        if f.is_array or f.type in VARIABLE:
            refuse = f"    raise {self.helper('null_not_allowed')}({what!r}, version)"
            if nullable == "False":
                guard = [f"if {value} is None:", refuse]
            elif nullable != "True":
                guard = [f"if {value} is None and not ({nullable}):", refuse]
        if f.is_array:
            item = f"item_{f.name}"
            if f.fields:
                element = [f"_encode_{f.element_type}({item}, {out}, version, flexible)"]
            else:
                element = self.write_primitive(f.element_type, item, out, flexible)
            count = (f"len({value})" if nullable == "False"
                     else f"None if {value} is None else len({value})")
            loop = [f"{self.helper('write_count')}({out}, {count}, {flexible})",
                    f"for {item} in {value} or ():" if nullable != "False"
                    else f"for {item} in {value}:",
                    *("    " + line for line in element)]
            return guard + loop
        if f.fields:
            return [f"_encode_{f.type}({value}, {out}, version, flexible)"]
        return guard + self.write_primitive(f.type, value, out, flexible)

    def write_primitive(self, kind: str, value: str, out: str, flexible: str) -> list[str]:
        if kind in FIXED:
            return [f"{out} += {self.struct(FIXED[kind])}.pack({value})"]
        helper = self.helper({"string": "write_string", "records": "write_records"
                              }.get(kind, "write_bytes"))
        return [f"{helper}({out}, {value}, {flexible})"]

    # -- messages -------------------------------------------------------------------------

    def _message_flexible(self, spec: MessageSpec) -> str:
        return _test(spec.flexible_versions)

    def emit_payload_decoder(self, spec: MessageSpec, record: str) -> str:
        name = f"decode_{snake(spec.name)}"
        low = spec.valid_versions.low
        self.spec_imports.add("trailing")
        self.codecs.append("\n".join([
            f"def {name}(payload: Buffer, version: int | None = None, context: object = None"
            f") -> {record}:",
            *docstring(f"Decode one whole {spec.name} payload of ``version`` "
                        f"(default {low}).", "    "),
            "    buf = payload if isinstance(payload, bytes) else bytes(payload)",
            "    if version is None:", f"        version = {low}",
            f"    if not ({_test(spec.valid_versions)}):",
            f"        raise ProtocolError(f'{spec.name}: unsupported version {{version}}')",
            f"    result, pos = _decode_{spec.name}(buf, 0, len(buf), version, "
            f"{self._message_flexible(spec)})",
            "    if pos != len(buf):",
            f"        raise trailing({spec.name!r}, len(buf) - pos)",
            "    return result",
        ]))
        # In place, with no copy: a header is followed by the body, a request's body
        # (megabytes of records, for Produce) follows its header in one payload.
        self.codecs.append("\n".join([
            f"def read_{snake(spec.name)}(buf: bytes, pos: int, end: int, version: int"
            f") -> tuple[{record}, int]:",
            *docstring(f"The {spec.name} of ``version`` at ``buf[pos:end]`` and the "
                        "position after it.", "    "),
            f"    if not ({_test(spec.valid_versions)}):",
            f"        raise ProtocolError(f'{spec.name}: unsupported version {{version}}')",
            f"    return _decode_{spec.name}(buf, pos, end, version, "
            f"{self._message_flexible(spec)})",
        ]))
        return name

    def emit_payload_encoder(self, spec: MessageSpec, record: str) -> str:
        name = f"encode_{snake(spec.name)}"
        low = spec.valid_versions.low
        self.spec_imports.add("cannot_encode")
        self.codecs.append("\n".join([
            f"def {name}(record: {record}, version: int | None = None, context: object = None"
            ") -> bytes:",
            *docstring(f"Encode a {spec.name} payload of ``version`` (default {low}).",
                        "    "),
            "    if version is None:", f"        version = {low}",
            f"    if not ({_test(spec.valid_versions)}):",
            f"        raise ValueError(f'{spec.name}: unsupported version {{version}}')",
            "    out = bytearray()",
            "    try:",
            f"        _encode_{spec.name}(record, out, version, "
            f"{self._message_flexible(spec)})",
            "    except StructError as exc:",
            f"        raise cannot_encode({spec.name!r}, exc) from None",
            "    return bytes(out)",
        ]))
        # In place: appends to ``out``, which may be a ``Parts`` (records kept apart).
        self.codecs.append("\n".join([
            f"def write_{snake(spec.name)}(record: {record}, out: bytearray, version: int"
            ") -> None:",
            *docstring(f"Append the {spec.name} of ``version`` to ``out``.", "    "),
            f"    if not ({_test(spec.valid_versions)}):",
            f"        raise ValueError(f'{spec.name}: unsupported version {{version}}')",
            "    try:",
            f"        _encode_{spec.name}(record, out, version, "
            f"{self._message_flexible(spec)})",
            "    except StructError as exc:",
            f"        raise cannot_encode({spec.name!r}, exc) from None",
        ]))
        return name

    def assemble(self, tables: list[str]) -> str:
        self.extra_imports = [
            f"from protocols.kafka.primitives import {', '.join(sorted(self.helpers))}"]
        flexible = ["", "#: The flexible versions of every message, by name (None: none).",
                    "FLEXIBLE_VERSIONS: Final[dict[str, tuple[int, int | None] | None]] = {"]
        for spec in self.specs:
            fv = spec.flexible_versions
            value = None if fv is None or fv.empty else (fv.low, fv.high)
            flexible.append(f"    {spec.name!r}: {value!r},")
        flexible.append("}")
        readers = ["", "#: ``read_<message>(buf, pos, end, version) -> (record, next pos)`` by "
                   "message name:", "#: the decoders that read in place.",
                   "READERS: Final[dict[str, Callable[[bytes, int, int, int], tuple[Any, "
                   "int]]]] = {",
                   *(f"    {spec.name!r}: read_{snake(spec.name)}," for spec in self.specs),
                   "}"]
        writers = ["", "#: ``write_<message>(record, out, version)`` by message name: the "
                   "encoders that append", "#: to a given buffer.",
                   "WRITERS: Final[dict[str, Callable[[Any, bytearray, int], None]]] = {",
                   *(f"    {spec.name!r}: write_{snake(spec.name)}," for spec in self.specs),
                   "}"]
        self.extra_imports.insert(0, "from collections.abc import Callable")
        return super().assemble(tables + flexible + readers + writers)
