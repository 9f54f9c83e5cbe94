"""The generator's core: what a generated module is (:class:`Target`) and how one is
written (:class:`Module`, the dialect of Tank's and Figg's declarations).

:mod:`protocols.codegen.kafka` extends :class:`Module` with Kafka's type system;
:mod:`protocols.generate` is the command that drives both. Imports run one way:
``generate`` -> ``codegen.kafka`` -> ``codegen.core``.
"""

from __future__ import annotations

import builtins
import keyword
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from protocols.spec import (
    BYTES_TYPES,
    FIXED_FORMATS,
    TEXT_TYPES,
    FieldSpec,
    MessageSpec,
    TypeRegistry,
    VersionRange,
)

COMMAND = "python -m protocols.generate"


@dataclass(frozen=True)
class Target:
    """One generated module: which declarations, how they travel, where it goes."""

    package: str  # holds specs/*.json
    module: str  # the generated module, dotted
    title: str  # first docstring line
    registry: TypeRegistry
    custom_module: str | None = None  # defines CUSTOM_TYPES and their record classes
    #: Kafka's type system (int16-length strings, flexible versions, tagged fields) rather
    #: than Tank's and Figg's: see :mod:`protocols.codegen.kafka`.
    kafka: bool = False
    #: Flat messages in a ``type | version | length`` frame: the header's struct format,
    #: the version it carries, and batch encoders by message name (shared leading fields).
    frame: str | None = None
    frame_version: int = 0
    batches: dict[str, int] = field(default_factory=dict)
    #: The answer of each request whose answer is not named after it (``XRequest`` is
    #: answered by ``XResponse`` when there is one).
    answers: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(*self.module.split(".")).with_suffix(".py")


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def docstring(text: str, indent: str) -> list[str]:
    text = text.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = text.splitlines() or [""]
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}', *(f"{indent}{line}".rstrip() for line in lines[1:]),
            f'{indent}"""']


def _version_test(versions: VersionRange, var: str = "version") -> str | None:
    """Source testing ``var`` against ``versions``; None when every version passes."""
    if versions.high is not None and versions.low == versions.high:
        return f"{var} == {versions.low}"
    tests = []
    if versions.low > 0:
        tests.append(f"{var} >= {versions.low}")
    if versions.high is not None:
        tests.append(f"{var} <= {versions.high}")
    return " and ".join(tests) or None


@dataclass
class RecordStruct:
    """A record class to emit: a message or an inline struct."""

    name: str
    fields: tuple[FieldSpec, ...]
    doc: str
    path: str = ""  # inline struct: field names from the message, dotted


class Module:
    """The source of one generated module, built up in parts."""

    def __init__(self, target: Target, specs: Sequence[MessageSpec]) -> None:
        self.target = target
        self.registry = target.registry
        self.prefix = self.registry.prefix
        self.specs = list(specs)
        self.spec_names = {spec.name for spec in self.specs}
        self.structs: dict[str, str] = {}  # format -> constant name
        self.customs: set[str] = set()
        self.annotation_names: set[str] = set()
        self.records: list[str] = []
        self.codecs: list[str] = []
        self.tables: list[str] = []
        self.spec_imports = {"Buffer"}
        self.wire_imports: set[str] = set()
        self.extra_imports: list[str] = []  # whole import lines a dialect adds

    # -- shared pieces --------------------------------------------------------------------

    def struct(self, fmt: str) -> str:
        if fmt not in self.structs:
            self.structs[fmt] = f"_S{len(self.structs)}"
        return self.structs[fmt]

    def custom(self, type_name: str) -> str:
        self.customs.add(type_name)
        return f"_{type_name}"

    def whole_payload(self, spec: MessageSpec) -> str | None:
        """The custom type that is a message's whole payload (its record is that type's)."""
        if len(spec.fields) == 1 and spec.fields[0].type in self.registry.custom:
            custom = self.registry.custom[spec.fields[0].type]
            if getattr(custom, "whole_payload", False):
                return spec.fields[0].type
        return None

    def annotation(self, spec: FieldSpec, owner: str) -> str:
        element = spec.element_type
        if spec.is_array and spec.fields:
            text = camel(element)
        elif element in FIXED_FORMATS or element == "varint":
            text = "int"
        elif element in TEXT_TYPES:
            text = "str"
        elif element in BYTES_TYPES:
            text = "bytes"
        elif element in self.registry.custom:
            text = self.registry.custom[element].annotation
            self.annotation_names.update(
                n for n in re.findall(r"\b[A-Z]\w*", text) if n != "None")
        else:
            raise ValueError(f"unknown type {element!r} in {owner}.{spec.name}")
        return f"list[{text}]" if spec.is_array else text

    def default(self, spec: FieldSpec) -> str:
        value = self.registry.default_for(spec)
        if isinstance(value, list):
            if value:
                raise ValueError(f"{spec.name}: a list default must be empty")
            return "[]"
        return repr(value)

    # -- record classes -------------------------------------------------------------------

    def record_classes(self, spec: MessageSpec) -> list[RecordStruct]:
        """The message's record and its inline structs, innermost first."""
        found: list[RecordStruct] = []

        def walk(name: str, fields: tuple[FieldSpec, ...], doc: str, path: str) -> None:
            for f in fields:
                self.registry.check(f.element_type if not f.fields else "uint8",
                                    f"{name}.{f.name}")
                if f.is_array and f.count not in (None, "rest"):
                    self.registry.check(f.count, f"{name}.{f.name} count")
                if f.fields:
                    child = camel(f.element_type)
                    walk(child, f.fields, f"One element of ``{name}.{f.name}``.",
                         f"{path}.{f.name}".lstrip("."))
            found.append(RecordStruct(name, fields, doc, path))

        doc = spec.about or spec.comment or f"The {spec.name} message."
        walk(spec.name, spec.fields, doc, "")
        return found

    def emit_record(self, rec: RecordStruct) -> None:
        """The record class (a :class:`protocols.record.Record` with its ``__init__``
        written out) and its builder."""
        answer = self.answer_of(rec)
        base = "Record" if answer is None else "Request"
        lines = [f"class {rec.name}({base if answer is None else f'Request[{answer!r}]'}):",
                 *docstring(rec.doc, "    ")]
        # Slot order does not matter to the layout (CPython sorts them) but ruff wants it.
        slots = "".join(repr(n) + ", " for n in sorted(f.name for f in rec.fields))
        order = "".join(repr(f.name) + ", " for f in rec.fields)
        lines += ["", f"    __slots__ = ({slots})", f"    __match_args__ = ({order})"]
        params, sets = [], []
        for f in rec.fields:
            check_name(rec.name, f.name)
            kind = self.annotation(f, rec.name)
            lines.append("")
            lines.append(f"    {f.name}: {kind}")
            if f.about:
                lines += docstring(f.about, "    ")
            default = self.default(f)
            if default == "[]" or default.endswith("()"):  # a list or a struct: made afresh
                params.append(f"{f.name}: {kind} = NEW_DEFAULT")
                sets.append(f"init_field(self, {f.name!r}, {default} if {f.name} is "
                            f"NEW_DEFAULT else {f.name})")
            else:
                params.append(f"{f.name}: {kind} = {default}")
                sets.append(f"init_field(self, {f.name!r}, {f.name})")
        lines += ["", f"    def __init__(self{''.join(', ' + p for p in params)}) -> None:",
                  *(f"        {line}" for line in sets or ["pass"])]
        args = ", ".join(f"{f.name}: {self.annotation(f, rec.name)}" for f in rec.fields)
        lines += [
            "", "",
            "if TYPE_CHECKING:",
            f"    _{rec.name}Builder = {rec.name}",
            "else:",
            f"    class _{rec.name}Builder({base}):",
            f'        """Makes a {rec.name} without the frozen ``__init__``'
            f' (see the module docstring)."""',
            "",
            f"        __slots__ = ({slots})",
            "        __setattr__ = object.__setattr__",
            "",
            f"        def __init__(self{', ' if args else ''}{args}) -> None:",
            *(f"            self.{f.name} = {f.name}" for f in rec.fields),
            *(["            pass"] if not rec.fields else []),
        ]
        self.records.append("\n".join(lines))

    def answer_of(self, rec: RecordStruct) -> str | None:
        """The record answering ``rec`` when it is a request message (not a struct in
        one), else None."""
        if rec.path or not rec.name.endswith("Request"):
            return None
        answer = self.target.answers.get(rec.name, rec.name[:-len("Request")] + "Response")
        return answer if answer in self.spec_names else None

    # -- payload decoders -----------------------------------------------------------------

    def emit_payload_decoder(self, spec: MessageSpec, record: str) -> str:
        name = f"decode_{snake(spec.name)}"
        lines = [
            f"def {name}(payload: Buffer, version: int | None = None, context: object = None"
            f") -> {record}:",
            f'    """Decode one whole {spec.name} payload."""',
            "    buf = payload if isinstance(payload, bytes) else bytes(payload)",
            "    end = len(buf)",
            "    pos = 0",
        ]
        valid = _version_test(spec.valid_versions)
        if spec.version_field is not None:
            fmt = FIXED_FORMATS[spec.fields[0].type]
            size = struct.calcsize(fmt)
            too_short = f"{spec.name}: payload too short for its version"
            lines += [
                f"    if end < {size}:",
                f"        raise ProtocolError({too_short!r})",
                "@@VERSION@@",
            ]
            read_version = f"    version = {self.struct(fmt)}.unpack_from(buf, 0)[0]"
        else:
            lines += ["    if version is None:", f"        version = {spec.valid_versions.low}"]
        if valid is not None:
            lines += [f"    if not ({valid}):",
                      f"        raise ProtocolError(f'{spec.name}: unsupported version "
                      "{version}')"]
        whole = self.whole_payload(spec)
        if whole is not None:
            lines += [
                "    reader = Reader(buf)",
                f"    result: {record} = {self.custom(whole)}.decode(reader, version, context)",
                "    pos = reader.pos",
            ]
            self.wire_imports.add("Reader")
        else:
            self.decode_fields(lines, spec.name, spec.fields, 1, 0, "result")
        lines += [
            "    if pos != end:",
            f"        raise trailing({spec.name!r}, end - pos)",
            "    return result",
        ]
        if "@@VERSION@@" in lines:
            at = lines.index("@@VERSION@@")
            if any(re.search(r"\bversion\b", line) for line in lines[at + 1:]):
                lines[at] = read_version
            else:
                del lines[at]
        self.spec_imports.update(("trailing",))
        self.codecs.append("\n".join(lines))
        return name

    def decode_fields(self, lines: list[str], owner: str, fields: tuple[FieldSpec, ...],
                      level: int, depth: int, target: str) -> None:
        """Lines leaving a record built from ``fields`` in ``target``."""
        ind = "    " * level
        names = []
        i = 0
        while i < len(fields):
            f = fields[i]
            if f.type in FIXED_FORMATS:
                group = [f]
                while (i + len(group) < len(fields)
                       and fields[i + len(group)].type in FIXED_FORMATS
                       and fields[i + len(group)].versions == f.versions):
                    group.append(fields[i + len(group)])
                body = self.decode_fixed(owner, group, depth)
            else:
                group = [f]
                body = self.decode_one(owner, f, depth)
            test = _version_test(f.versions)
            if test is None:
                lines += [ind + line for line in body]
            else:
                lines.append(f"{ind}if {test}:")
                lines += [ind + "    " + line for line in body]
                lines.append(f"{ind}else:")
                for g in group:
                    absent = self.default(g)
                    lines.append(f"{ind}    {_local(g.name, depth)} = {absent}")
            names += [_local(g.name, depth) for g in group]
            i += len(group)
        rec = camel(owner) if depth else owner
        lines.append(f"{ind}{target} = _{rec}Builder({', '.join(names)})")
        lines.append(f"{ind}{target}.__class__ = {rec}")

    def decode_fixed(self, owner: str, group: list[FieldSpec], depth: int) -> list[str]:
        fmt = "".join(FIXED_FORMATS[f.type] for f in group)
        size = struct.calcsize(self.prefix + fmt)
        what = f"{owner}.{'/'.join(f.name for f in group)}"
        targets = ", ".join(_local(f.name, depth) for f in group)
        self.spec_imports.add("truncated")
        if fmt == "B":
            read = f"{targets} = buf[pos]"
        else:
            read = f"{targets}{',' if len(group) == 1 else ''} = " \
                   f"{self.struct(fmt)}.unpack_from(buf, pos)"
        return [f"if end - pos < {size}:", f"    raise truncated({what!r}, pos, end)",
                read, f"pos += {size}"]

    def decode_one(self, owner: str, f: FieldSpec, depth: int) -> list[str]:
        var = _local(f.name, depth)
        what = f"{owner}.{f.name}"
        if f.is_array:
            return self.decode_array(owner, f, depth)
        return self.decode_value(f.type, var, what)

    @staticmethod
    def _take(var: str, what: str, piece: str, advance: str, *, text: bool) -> list[str]:
        """Lines setting ``var`` to ``piece`` (decoded as UTF-8 when ``text``), then
        ``advance``."""
        if not text:
            return [f"{var} = {piece}", advance]
        return ["try:", f"    {var} = {piece}.decode()", "except UnicodeDecodeError:",
                f"    raise not_utf8({what!r}) from None", advance]

    def decode_value(self, type_name: str, var: str, what: str) -> list[str]:
        """Lines reading one value of a primitive or custom type into ``var``."""
        if type_name in ("str8", "bytes8"):
            self.spec_imports.update(("truncated", "not_utf8"))
            lines = [
                "if pos >= end:",
                f"    raise truncated({what + ' length'!r}, pos, end)",
                "stop = pos + 1 + buf[pos]",
                "if stop > end:",
                f"    raise truncated({what!r}, pos + 1, end)",
            ]
            return [*lines, *self._take(var, what, "buf[pos + 1:stop]", "pos = stop",
                                        text=type_name == "str8")]
        if type_name in ("string", "bytes"):
            self.spec_imports.update(("truncated", "overrun", "not_utf8"))
            lines = [
                "if end - pos < 4:",
                f"    raise truncated({what + ' length'!r}, pos, end)",
                f"n = {self.struct('I')}.unpack_from(buf, pos)[0]",
                "pos += 4",
                "if n > end - pos:",
                f"    raise overrun({what!r}, n, end - pos)",
            ]
            return [*lines, *self._take(var, what, "buf[pos:pos + n]", "pos += n",
                                        text=type_name == "string")]
        if type_name in ("varint", "varbytes"):
            self.spec_imports.update(("truncated", "read_varint"))
            target = var if type_name == "varint" else "n"
            lines = [
                "if pos >= end:",
                f"    raise truncated({what!r}, pos, end)",
                f"{target} = buf[pos]",
                f"if {target} < 0x80:",
                "    pos += 1",
                "else:",
                f"    {target}, pos = read_varint(buf, pos, end, {what!r})",
            ]
            if type_name == "varint":
                return lines
            self.spec_imports.add("overrun")
            return [*lines, "if n > end - pos:", f"    raise overrun({what!r}, n, end - pos)",
                    f"{var} = buf[pos:pos + n]", "pos += n"]
        if type_name == "rest":
            return [f"{var} = buf[pos:end]", "pos = end"]
        if type_name in FIXED_FORMATS:
            fmt = FIXED_FORMATS[type_name]
            size = struct.calcsize(fmt)
            self.spec_imports.add("truncated")
            read = (f"{var} = buf[pos]" if fmt == "B"
                    else f"{var} = {self.struct(fmt)}.unpack_from(buf, pos)[0]")
            return [f"if end - pos < {size}:", f"    raise truncated({what!r}, pos, end)",
                    read, f"pos += {size}"]
        custom = self.custom(type_name)
        self.wire_imports.add("Reader")
        return ["reader = Reader(buf, pos, end)",
                f"{var} = {custom}.decode(reader, version, context)",
                "pos = reader.pos"]

    def decode_array(self, owner: str, f: FieldSpec, depth: int) -> list[str]:
        var = _local(f.name, depth)
        what = f"{owner}.{f.name}"
        item = f"item{depth + 1}"
        element: list[str] = []
        if f.fields:
            self.decode_fields(element, camel(f.element_type), f.fields, 0, depth + 1, item)
        else:
            element = self.decode_value(f.element_type, item, f"{what} element")
        kind = self.annotation(f, owner)
        lines = [f"{var}: {kind} = []"]
        count_type = f.count or "uint32"
        if count_type == "rest":
            return [*lines, "while pos < end:", *("    " + line for line in element),
                    f"    {var}.append({item})"]
        count = f"count{depth}"
        lines += self.decode_value(count_type, count, f"{what} count")
        self.spec_imports.add("count_overrun")
        return [*lines,
                f"if {count} > end - pos:",
                f"    raise count_overrun({what!r}, {count}, end - pos)",
                f"for _ in range({count}):",
                *("    " + line for line in element),
                f"    {var}.append({item})"]

    # -- payload encoders -----------------------------------------------------------------

    def emit_payload_encoder(self, spec: MessageSpec, record: str) -> str:
        name = f"encode_{snake(spec.name)}"
        lines = [
            f"def {name}(record: {record}, version: int | None = None, context: object = None"
            ") -> bytes:",
            f'    """Encode a {spec.name} payload."""',
        ]
        if spec.version_field is not None:
            lines.append("@@VERSION@@")
        else:
            lines += ["    if version is None:", f"        version = {spec.valid_versions.low}"]
        valid = _version_test(spec.valid_versions)
        if valid is not None:
            lines += [f"    if not ({valid}):",
                      f"        raise ValueError(f'{spec.name}: unsupported version {{version}}')"]
        lines.append("    out = bytearray()")
        whole = self.whole_payload(spec)
        body: list[str] = []
        if whole is not None:
            body.append(f"{self.custom(whole)}.encode(record, version, out, context)")
        else:
            self.encode_fields(body, spec.fields, "record", 0)
        if body:
            self.spec_imports.update(("cannot_encode",))
            lines += ["    try:", *("        " + line for line in body),
                      "    except StructError as exc:",
                      f"        raise cannot_encode({spec.name!r}, exc) from None"]
        lines.append("    return bytes(out)")
        if "@@VERSION@@" in lines:
            at = lines.index("@@VERSION@@")
            if any(re.search(r"\bversion\b", line) for line in lines[at + 1:]):
                lines[at] = f"    version = record.{spec.version_field}"
            else:
                del lines[at]
        self.codecs.append("\n".join(lines))
        return name

    def encode_fields(self, lines: list[str], fields: tuple[FieldSpec, ...], rec: str,
                      depth: int) -> None:
        i = 0
        while i < len(fields):
            f = fields[i]
            if f.type in FIXED_FORMATS:
                group = [f]
                while (i + len(group) < len(fields)
                       and fields[i + len(group)].type in FIXED_FORMATS
                       and fields[i + len(group)].versions == f.versions):
                    group.append(fields[i + len(group)])
                fmt = "".join(FIXED_FORMATS[g.type] for g in group)
                values = ", ".join(f"{rec}.{g.name}" for g in group)
                body = [f"out += {self.struct(fmt)}.pack({values})"]
            else:
                group = [f]
                body = self.encode_one(f, f"{rec}.{f.name}", depth)
            test = _version_test(f.versions)
            if test is None:
                lines += body
            else:
                lines.append(f"if {test}:")
                lines += ["    " + line for line in body]
            i += len(group)

    def encode_one(self, f: FieldSpec, value: str, depth: int) -> list[str]:
        if not f.is_array:
            return self.encode_value(f.type, value)
        item = f"item{depth + 1}"
        lines = []
        count_type = f.count or "uint32"
        if count_type != "rest":
            lines += self.encode_value(count_type, f"len({value})")
        element: list[str] = []
        if f.fields:
            self.encode_fields(element, f.fields, item, depth + 1)
        else:
            element = self.encode_value(f.element_type, item)
        return [*lines, f"for {item} in {value}:", *("    " + line for line in element)]

    def encode_value(self, type_name: str, value: str) -> list[str]:
        if type_name in FIXED_FORMATS:
            return [f"out += {self.struct(FIXED_FORMATS[type_name])}.pack({value})"]
        if type_name in ("str8", "bytes8"):
            self.wire_imports.add("encode_str8")
            return [f"out += encode_str8({value})"]
        if type_name == "string":
            return [f"raw = {value}.encode()", f"out += {self.struct('I')}.pack(len(raw))",
                    "out += raw"]
        if type_name == "bytes":
            return [f"out += {self.struct('I')}.pack(len({value}))", f"out += {value}"]
        if type_name == "varint":
            self.wire_imports.add("encode_varint")
            return [f"out += encode_varint({value})"]
        if type_name == "varbytes":
            self.wire_imports.add("encode_varint")
            return [f"out += encode_varint(len({value}))", f"out += {value}"]
        if type_name == "rest":
            return [f"out += {value}"]
        return [f"{self.custom(type_name)}.encode({value}, version, out, context)"]

    # -- flat frame codecs (Figg) ---------------------------------------------------------

    def emit_flat(self, spec: MessageSpec) -> tuple[str, str, str]:
        """``decode_<name>``, ``encode_<name>_frame``, ``encode_<name>_record``."""
        _check_flat(spec)
        base = snake(spec.name)
        fields = spec.fields
        self.spec_imports.update(("truncated", "overrun", "trailing", "not_utf8",
                                  "cannot_encode"))
        # Decoder: one unpack per run of fixed fields and the length of the variable
        # field that closes it.
        body = [f"def decode_{base}(payload: bytes) -> {spec.name}:",
                f'    """Decode a {spec.name} payload (``bytes``: the variable fields are '
                'slices of it)."""',
                "    end = len(payload)", "    pos = 0"]
        for run, variable in _segments(fields):
            fmt = _flat_format(run, variable)
            size = struct.calcsize(">" + fmt)
            targets = [_local(f.name, 0) for f in run] + (["n"] if variable else [])
            what = "/".join([f.name for f in run]
                            + ([f"{variable.name} length"] if variable else []))
            body += [
                f"    if end - pos < {size}:",
                f"        raise truncated({f'{spec.name}.{what}'!r}, pos, end)",
                f"    {', '.join(targets)}, = {self.struct(fmt)}.unpack_from(payload, pos)",
                f"    pos += {size}",
            ]
            if variable is None:
                continue
            var, what = _local(variable.name, 0), f"{spec.name}.{variable.name}"
            body += ["    if n > end - pos:",
                     f"        raise overrun({what!r}, n, end - pos)"]
            if variable.type == "string":
                body += ["    try:",
                         f"        {var} = payload[pos:pos + n].decode()",
                         "    except UnicodeDecodeError:",
                         f"        raise not_utf8({what!r}) from None"]
            else:
                body.append(f"    {var} = payload[pos:pos + n]")
            body.append("    pos += n")
        args = ", ".join(_local(f.name, 0) for f in fields)
        body += ["    if pos != end:",
                 f"        raise trailing({spec.name!r}, end - pos)",
                 f"    record = _{spec.name}Builder({args})",
                 f"    record.__class__ = {spec.name}",
                 "    return record"]
        self.codecs.append("\n".join(body))
        # Encoders: the header and the first run in one pack, the variable fields joined.
        lengths = {f.name: f"n{i}" for i, f in enumerate(fields) if _is_variable(f)}
        parts = []
        for k, (run, variable) in enumerate(_segments(fields)):
            fmt = _flat_format(run, variable)
            values = [f.name for f in run] + ([lengths[variable.name]] if variable else [])
            if k == 0:
                fmt = self.target.frame[1:] + fmt if self.target.frame else fmt
                values = self.header_values(spec, list(lengths.values())) + values
            parts.append(f"{self.struct(fmt)}.pack({', '.join(values)})")
            if variable:
                parts.append(variable.name)
        params = ", ".join(f"{f.name}: {'int' if f.type in FIXED_FORMATS else 'bytes'}"
                           for f in fields)
        from_record = ", ".join(f"record.{f.name}.encode()" if f.type == "string"
                                else f"record.{f.name}" for f in fields)
        self.codecs.append("\n".join([
            f"def encode_{base}_frame({params}) -> bytes:",
            f'    """A whole {spec.name} frame; strings given UTF-8 encoded."""',
            *(f"    {n} = len({name})" for name, n in lengths.items()),
            "    try:",
            f"        return {' + '.join(parts)}",
            "    except StructError as exc:",
            f"        raise cannot_encode({spec.name!r}, exc) from None",
        ]))
        self.codecs.append("\n".join([
            f"def encode_{base}_record(record: {spec.name}) -> bytes:",
            f'    """A whole {spec.name} frame from a record."""',
            f"    return encode_{base}_frame({from_record})",
        ]))
        self.emit_flat_payload(spec)
        return f"decode_{base}", f"encode_{base}_frame", f"encode_{base}_record"

    def header_values(self, spec: MessageSpec, lengths: list[str]) -> list[str]:
        fixed = struct.calcsize(">" + "".join(
            "I" if _is_variable(f) else FIXED_FORMATS[f.type] for f in spec.fields))
        return [str(spec.api_key), str(self.target.frame_version),
                " + ".join([str(fixed), *lengths])]

    def emit_flat_payload(self, spec: MessageSpec) -> None:
        """The payload codecs of a flat message: the frame codecs without the header."""
        base = snake(spec.name)
        header = struct.calcsize(self.target.frame or "")
        valid = _version_test(spec.valid_versions)
        check = ([f"    if not ({valid}):",
                  f"        raise {{error}}(f'{spec.name}: unsupported version {{{{version}}}}')"]
                 if valid else [])
        low = spec.valid_versions.low
        self.codecs.append("\n".join([
            f"def decode_{base}_payload(payload: Buffer, version: int | None = None, "
            f"context: object = None) -> {spec.name}:",
            f'    """Decode a {spec.name} payload of ``version`` (default {low})."""',
            "    if version is None:", f"        version = {low}",
            *(line.format(error="ProtocolError") for line in check),
            f"    return decode_{base}(payload if isinstance(payload, bytes) "
            "else bytes(payload))",
        ]))
        self.codecs.append("\n".join([
            f"def encode_{base}_payload(record: {spec.name}, version: int | None = None, "
            "context: object = None) -> bytes:",
            f'    """Encode a {spec.name} payload of ``version`` (default {low})."""',
            "    if version is None:", f"        version = {low}",
            *(line.format(error="ValueError") for line in check),
            f"    return encode_{base}_record(record)[{header}:]",
        ]))

    def emit_batch(self, spec: MessageSpec, shared: int) -> str:
        """``encode_<name>_frames(*first_fields, items)``: frames sharing ``shared`` fields.

        Everything but a trailing variable field is packed with one ``struct`` built for
        the shared values, and that field is joined in without an intermediate copy.
        """
        fields = spec.fields
        head, each = fields[:shared], fields[shared:]
        if not each or any(_is_variable(f) for f in each[:-1]):
            raise ValueError(f"{spec.name}: only the last per-frame field may vary in size")
        tail = each[-1] if _is_variable(each[-1]) else None
        packed_each = each[:-1] if tail else each
        lengths = {f.name: f"n{i}" for i, f in enumerate(fields) if _is_variable(f)}
        assert self.target.frame is not None
        fmt_parts, values = [repr(self.target.frame)], self.header_values(
            spec, list(lengths.values()))
        for f in head:
            if _is_variable(f):
                fmt_parts.append(f"f'I{{{lengths[f.name]}}}s'")
                values += [lengths[f.name], f.name]
            else:
                fmt_parts.append(repr(FIXED_FORMATS[f.type]))
                values.append(f.name)
        fmt_parts.append(repr(_flat_format(list(packed_each), tail)))
        values += [f.name for f in packed_each] + ([lengths[tail.name]] if tail else [])
        kinds = ", ".join("int" if f.type in FIXED_FORMATS else "bytes" for f in each)
        item = f"tuple[{kinds}]"
        name = f"encode_{snake(spec.name)}_frames"
        params = "".join(f"{f.name}: {'int' if f.type in FIXED_FORMATS else 'bytes'}, "
                         for f in head)
        self.codecs.append("\n".join([
            f"def {name}({params}items: Iterable[{item}]) -> bytes:",
            f'    """Many {spec.name} frames sharing their first {shared} field(s), joined: '
            "``items``",
            f'    yields ({", ".join(f.name for f in each)}); strings UTF-8 encoded."""',
            *(f"    {lengths[f.name]} = len({f.name})" for f in head if _is_variable(f)),
            "    parts: list[bytes] = []",
            "    append = parts.append",
            "    try:",
            f"        pack = Struct({' + '.join(fmt_parts)}).pack",
            f"        for {''.join(f'{f.name}, ' for f in each)}in items:",
            *([f"            {lengths[tail.name]} = len({tail.name})"] if tail else []),
            f"            append(pack({', '.join(values)}))",
            *([f"            append({tail.name})"] if tail else []),
            "    except StructError as exc:",
            f"        raise cannot_encode({spec.name!r}, exc) from None",
            "    return b''.join(parts)",
        ]))
        return name

    # -- the module -----------------------------------------------------------------------

    def render(self) -> str:
        payload_rows, flat_rows, batch_names = [], [], []
        for spec in self.specs:
            whole = self.whole_payload(spec)
            nested: list[tuple[str, str]] = []
            if whole is None:
                for rec in self.record_classes(spec):
                    self.emit_record(rec)
                    if rec.path:
                        nested.append((rec.path, rec.name))
                record = spec.name
            else:
                record = self.registry.custom[whole].annotation
                self.annotation_names.add(record)
            if self.target.frame is not None:
                decode, encode_frame, encode_record = self.emit_flat(spec)
                flat_rows.append(f"    {spec.name!r}: FlatCodec({spec.name}, {decode}, "
                                 f"{encode_frame}, {encode_record}),")
                decode, encode = (f"decode_{snake(spec.name)}_payload",
                                  f"encode_{snake(spec.name)}_payload")
                if spec.name in self.target.batches:
                    batch_names.append(self.emit_batch(spec, self.target.batches[spec.name]))
            else:
                decode = self.emit_payload_decoder(spec, record)
                encode = self.emit_payload_encoder(spec, record)
            inner = ", ".join(f"{path!r}: {cls}" for path, cls in nested)
            payload_rows.append(f"    {spec.name!r}: ({record}, {decode}, {encode}, "
                                f"{{{inner}}}),")
        self.spec_imports.add("PayloadFunctions")
        tables = [
            "#: Every message's record class, payload decoder and encoder, and the record "
            "classes of its",
            "#: inline structs by field path, by message name.",
            "PAYLOAD_CODECS: Final[dict[str, PayloadFunctions]] = {",
            *payload_rows, "}",
        ]
        if flat_rows:
            self.spec_imports.add("FlatCodec")
            tables += ["", "#: Every message's frame codec, by message name.",
                       "FLAT_CODECS: Final[dict[str, FlatCodec[Any]]] = {", *flat_rows, "}"]
        return self.assemble(tables)

    def assemble(self, tables: list[str]) -> str:
        target = self.target
        folder = target.package.replace(".", "/") + "/specs/*.json"
        typing_names = ["TYPE_CHECKING", "Any", "Final"]
        imports = [
            "from __future__ import annotations", "",
            *(["from collections.abc import Iterable"] if target.batches else []),
            "from struct import Struct",
            "from struct import error as StructError",
            f"from typing import {', '.join(typing_names)}", "",
            "from protocols.errors import ProtocolError",
            "from protocols.record import " + ", ".join(
                (["NEW_DEFAULT"] if any("NEW_DEFAULT" in r for r in self.records) else [])
                + ["Record"]
                + (["Request"] if any("(Request[" in r for r in self.records) else [])
                + ["init_field"]),
            f"from protocols.spec import {', '.join(sorted(self.spec_imports))}",
        ]
        if target.custom_module is not None:
            names = sorted(self.annotation_names | {"CUSTOM_TYPES"})
            imports.append(f"from {target.custom_module} import {', '.join(names)}")
        if self.wire_imports:
            imports.append(f"from protocols.wire import {', '.join(sorted(self.wire_imports))}")
        imports += self.extra_imports
        constants = [f"{name}: Final = Struct({self.prefix + fmt!r})"
                     for fmt, name in self.structs.items()]
        constants += [f"_{name}: Final = CUSTOM_TYPES[{name!r}]" for name in sorted(self.customs)]
        header = "\n".join([
            f'"""{target.title}, generated from ``{folder}``.',
            "",
            f"GENERATED by ``{COMMAND}``: do not edit. Change the declarations (or",
            "``protocols/codegen/``) and run it again; ``tests/protocols/test_generate.py``",
            "fails while this file is not what the generator makes.",
            '"""',
            "",
            "# ruff: noqa: E501, I001, RUF100",
        ])
        parts = [header, "\n".join(imports), "\n".join(constants), *self.records,
                 *self.codecs, "\n".join(tables)]
        if "Iterable" not in "\n".join(self.codecs):
            parts[1] = parts[1].replace("from collections.abc import Iterable\n", "")
        if not re.search(r"\bAny\b", "\n".join(parts[2:])):
            parts[1] = parts[1].replace(", Any,", ",")
        return "\n\n\n".join(p for p in parts if p) + "\n"


def _local(name: str, depth: int) -> str:
    return f"{name}_{depth}" if depth else f"{name}_"


def check_name(owner: str, name: str, *, parameter: bool = False) -> None:
    """Field names become attributes (and, in flat encoders, parameters)."""
    if (not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_")
            or (parameter and hasattr(builtins, name))):
        raise ValueError(f"{owner}.{name}: not usable as a Python name")


def _is_variable(spec: FieldSpec) -> bool:
    return spec.type in ("string", "bytes")


def _check_flat(spec: MessageSpec) -> None:
    if spec.version_field is not None:
        raise ValueError(f"{spec.name}: a flat message has no version field")
    for f in spec.fields:
        if f.type not in FIXED_FORMATS and not _is_variable(f):
            raise ValueError(f"{spec.name}.{f.name}: type {f.type!r} is not flat")
        if not f.versions.covers(spec.valid_versions):
            raise ValueError(f"{spec.name}.{f.name}: a flat field is in every version")
        check_name(spec.name, f.name, parameter=True)


def _segments(fields: Iterable[FieldSpec]) -> list[tuple[list[FieldSpec], FieldSpec | None]]:
    """Runs of fixed fields, each closed by a variable field or by the end."""
    segments: list[tuple[list[FieldSpec], FieldSpec | None]] = []
    run: list[FieldSpec] = []
    for spec in fields:
        if spec.type in FIXED_FORMATS:
            run.append(spec)
        else:
            segments.append((run, spec))
            run = []
    if run:
        segments.append((run, None))
    return segments


def _flat_format(run: list[FieldSpec], variable: FieldSpec | None) -> str:
    return "".join(FIXED_FORMATS[f.type] for f in run) + ("I" if variable else "")
