"""Straight-line codecs generated from flat declarations, for the hot paths.

Every Figg message is *flat*: fixed-width integers and ``u32 len | bytes`` fields
(``string`` or ``bytes``), no arrays and no per-field versions. For such a declaration
:class:`FlatCodec` generates Python source once, at import, the way ``dataclasses``
builds ``__init__``: one ``struct`` call per run of fixed fields (the length prefix of the
variable field after them included), one slice per variable field, no loops and no
per-field dispatch. It decodes to the engine's own record class and raises
:class:`ProtocolError` in exactly the cases :meth:`MessageCodec.decode` does (the tests
hold the two to that): the engine codec is the reference, this is its compiled form.
"""

from __future__ import annotations

import builtins
import keyword
import struct
from collections.abc import Callable
from typing import Any

from protocols.errors import ProtocolError
from protocols.spec import FIXED_FORMATS, FieldSpec, MessageCodec

_VARIABLE_TYPES = ("string", "bytes")
_LENGTH = "I"  # the u32 length prefix of a variable field

# A run of fixed fields, closed by a variable field or by the end of the message.
_Segment = tuple[list[FieldSpec], FieldSpec | None]


def _segments(fields: tuple[FieldSpec, ...]) -> list[_Segment]:
    segments: list[_Segment] = []
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


def _format(run: list[FieldSpec], variable: FieldSpec | None) -> str:
    return "".join(FIXED_FORMATS[f.type] for f in run) + (_LENGTH if variable else "")


def _is_variable(spec: FieldSpec) -> bool:
    return spec.type in _VARIABLE_TYPES


def _check_flat(codec: MessageCodec) -> None:
    spec = codec.spec
    if spec.version_field is not None:
        raise ValueError(f"{spec.name}: a flat message has no version field")
    for f in spec.fields:
        if f.type not in FIXED_FORMATS and not _is_variable(f):
            raise ValueError(f"{spec.name}.{f.name}: type {f.type!r} is not flat")
        if not f.versions.covers(spec.valid_versions):
            raise ValueError(f"{spec.name}.{f.name}: a flat field is in every version")
        # Field names become parameters and locals of the generated functions.
        if (not f.name.isidentifier() or keyword.iskeyword(f.name) or f.name.startswith("_")
                or hasattr(builtins, f.name)):
            raise ValueError(f"{spec.name}.{f.name}: not usable as a Python name")


def _truncated(what: str, pos: int, end: int) -> ProtocolError:
    return ProtocolError(f"truncated {what}: payload ends {end - pos} bytes after offset {pos}")


def _overrun(what: str, length: int, left: int) -> ProtocolError:
    return ProtocolError(f"{what}: length {length} overruns the payload ({left} bytes left)")


def _trailing(what: str, left: int) -> ProtocolError:
    return ProtocolError(f"{left} unexpected trailing bytes in {what}")


def _not_utf8(what: str) -> ProtocolError:
    return ProtocolError(f"{what} is not UTF-8")


class FlatCodec:
    """The generated fast codec of one flat message in a ``type | version | length`` frame.

    - ``decode(payload: bytes) -> record``: the payload must be ``bytes`` (the variable
      fields are slices of it, so never a view of a reused buffer).
    - ``encode_frame(*fields) -> bytes``: the whole frame, header included. ``string``
      fields are passed already UTF-8 encoded, so a caller sending many frames for one
      topic encodes the name once. Values that do not fit raise ``ValueError``.
    - ``encode_record(record) -> bytes``: the same from a record (``str`` strings).
    - :meth:`batch_encoder`: many frames sharing their leading fields, in one go.

    ``source`` holds the generated code.
    """

    def __init__(self, codec: MessageCodec, header: struct.Struct, version: int) -> None:
        _check_flat(codec)
        self.codec = codec
        self.header = header
        self.version = version
        self.source = "\n".join([*self._decoder_source(), "", *self._encoder_source()])
        namespace = self._run(self.source)
        self.decode: Callable[[bytes], Any] = namespace["decode"]
        self.encode_frame: Callable[..., bytes] = namespace["encode_frame"]
        self.encode_record: Callable[[Any], bytes] = namespace["encode_record"]

    @property
    def _fields(self) -> tuple[FieldSpec, ...]:
        return self.codec.spec.fields

    def _struct(self, fmt: str) -> str:
        """Source naming a precompiled ``struct.Struct`` in the protocol's byte order."""
        return f"_Struct({self.header.format[0] + fmt!r})"

    def _run(self, source: str) -> dict[str, Any]:
        namespace: dict[str, Any] = {
            "_Struct": struct.Struct, "_record": self.codec.record,
            "_struct_error": struct.error, "_truncated": _truncated, "_overrun": _overrun,
            "_trailing": _trailing, "_not_utf8": _not_utf8,
        }
        exec(compile(source, f"<flat codec {self.codec.name}>", "exec"), namespace)
        return namespace

    def _decoder_source(self) -> list[str]:
        name = self.codec.name
        lines = []
        body = ["def decode(_p):", "    _end = len(_p)", "    _pos = 0"]
        for k, (run, variable) in enumerate(_segments(self._fields)):
            fmt = _format(run, variable)
            size = struct.calcsize(">" + fmt)
            lines.append(f"_unpack{k} = {self._struct(fmt)}.unpack_from")
            targets = [f.name for f in run] + (["_n"] if variable else [])
            what = "/".join([f.name for f in run] + ([f"{variable.name} length"]
                                                      if variable else []))
            body += [
                f"    if _end - _pos < {size}:",
                f"        raise _truncated({f'{name}.{what}'!r}, _pos, _end)",
                f"    {', '.join(targets)}, = _unpack{k}(_p, _pos)",
                f"    _pos += {size}",
            ]
            if variable is None:
                continue
            field, what = variable.name, f"{name}.{variable.name}"
            body += [
                "    if _n > _end - _pos:",
                f"        raise _overrun({what!r}, _n, _end - _pos)",
                f"    {field} = _p[_pos:_pos + _n]",
                "    _pos += _n",
            ]
            if variable.type == "string":
                body += [
                    "    try:",
                    f"        {field} = {field}.decode()",
                    "    except UnicodeDecodeError:",
                    f"        raise _not_utf8({what!r}) from None",
                ]
        return [*lines, "", *body,
                "    if _pos != _end:",
                f"        raise _trailing({name!r}, _end - _pos)",
                f"    return _record({', '.join(f.name for f in self._fields)})"]

    def _header_values(self, lengths: list[str]) -> list[str]:
        """Source for ``type, version, payload length`` given the variable fields' lengths."""
        fixed = struct.calcsize(">" + "".join(
            _LENGTH if _is_variable(f) else FIXED_FORMATS[f.type] for f in self._fields))
        return [str(self.codec.api_key), str(self.version), " + ".join([str(fixed), *lengths])]

    def _encoder_source(self) -> list[str]:
        fields = self._fields
        lengths = {f.name: f"_n{i}" for i, f in enumerate(fields) if _is_variable(f)}
        lines, parts = [], []
        for k, (run, variable) in enumerate(_segments(fields)):
            fmt = _format(run, variable)
            values = [f.name for f in run] + ([lengths[variable.name]] if variable else [])
            if k == 0:
                fmt = self.header.format[1:] + fmt
                values = self._header_values(list(lengths.values())) + values
            lines.append(f"_pack{k} = {self._struct(fmt)}.pack")
            parts.append(f"_pack{k}({', '.join(values)})")
            if variable:
                parts.append(variable.name)
        from_record = ", ".join(
            f"_r.{f.name}.encode()" if f.type == "string" else f"_r.{f.name}" for f in fields)
        return [
            *lines, "",
            f"def encode_frame({', '.join(f.name for f in fields)}):",
            *(f"    {n} = len({field})" for field, n in lengths.items()),
            "    try:",
            f"        return {' + '.join(parts)}",
            "    except _struct_error as _exc:",
            f"        raise ValueError(f'{self.codec.name}: {{_exc}}') from None",
            "",
            "def encode_record(_r):",
            f"    return encode_frame({from_record})",
        ]

    def batch_encoder(self, shared: int) -> Callable[..., bytes]:
        """Generate ``encode_frames(*first_fields, items) -> bytes``.

        The frames share their first ``shared`` fields (given once, strings as UTF-8
        bytes); ``items`` yields tuples of the other fields, one per frame. Everything but
        a trailing variable field is packed with one ``struct`` built for the shared
        values, and that field is joined in without an intermediate copy: for DATA, one
        ``pack`` and two list appends a frame. Only the last per-frame field may be
        variable.
        """
        fields = self._fields
        head, each = fields[:shared], fields[shared:]
        if not each or any(_is_variable(f) for f in each[:-1]):
            raise ValueError(f"{self.codec.name}: only the last per-frame field may vary in size")
        tail = each[-1] if _is_variable(each[-1]) else None
        packed_each = each[:-1] if tail else each
        lengths = {f.name: f"_n{i}" for i, f in enumerate(fields) if _is_variable(f)}
        fmt_parts, values = [repr(self.header.format)], self._header_values(list(lengths.values()))
        for f in head:
            if _is_variable(f):
                fmt_parts.append(f"'{_LENGTH}%ds' % {lengths[f.name]}")
                values += [lengths[f.name], f.name]
            else:
                fmt_parts.append(repr(FIXED_FORMATS[f.type]))
                values.append(f.name)
        fmt_parts.append(repr(_format(list(packed_each), tail)))
        values += [f.name for f in packed_each] + ([lengths[tail.name]] if tail else [])
        targets = "".join(f"{f.name}, " for f in each)
        source = "\n".join([
            f"def encode_frames({''.join(f'{f.name}, ' for f in head)}_items):",
            *(f"    {lengths[f.name]} = len({f.name})" for f in head if _is_variable(f)),
            "    _parts = []",
            "    _append = _parts.append",
            "    try:",
            f"        _pack = _Struct({' + '.join(fmt_parts)}).pack",
            f"        for {targets}in _items:",
            *([f"            {lengths[tail.name]} = len({tail.name})"] if tail else []),
            f"            _append(_pack({', '.join(values)}))",
            *([f"            _append({tail.name})"] if tail else []),
            "    except _struct_error as _exc:",
            f"        raise ValueError(f'{self.codec.name}: {{_exc}}') from None",
            "    return b''.join(_parts)",
        ])
        return self._run(source)["encode_frames"]
