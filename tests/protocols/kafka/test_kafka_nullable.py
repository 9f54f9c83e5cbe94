"""Every nullable field of every declared Kafka message, at every version that lets it be
null: a record with that field null and every other field set (non-default, arrays of one
element) round-trips, so the decoder reads on past the null and the fields after it come
back intact. Kafka's own encoding of a null is checked too: ``-1`` in a fixed-width
length, ``0`` in a compact one.

The bug this guards against: a decoder that, after a null compact array, stops reading
the struct (fields after it left as trailing bytes) or reads them at the wrong place.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from protocols.codegen.core import snake
from protocols.kafka import records
from protocols.kafka.messages import CODECS, is_flexible
from protocols.spec import FieldSpec
from tests.protocols.kafka.samples import EVERY_VERSION

#: A non-default value of each primitive type (defaults are 0, False, "" and empty).
_SET = {"int8": 7, "int16": 300, "uint16": 65000, "int32": 70000, "uint32": 4000000000,
        "int64": 1 << 40, "float64": 2.5, "bool": True, "uuid": bytes(range(16)),
        "string": "set", "bytes": b"set", "records": b"set"}

Path = tuple[str, ...]


def _full(f: FieldSpec, version: int, null: Path, here: Path) -> Any:
    if here == null:
        return None
    if f.is_array:
        if f.fields:
            return [_struct(f.element_type, f.fields, version, null, here)]
        return [_SET[f.element_type]]
    if f.fields:
        return _struct(f.type, f.fields, version, null, here)
    return _SET[f.type]


def _struct(cls_name: str, fields: tuple[FieldSpec, ...], version: int, null: Path,
            here: Path = ()) -> Any:
    values = {snake(f.name): _full(f, version, null, (*here, f.name))
              for f in fields if version in f.versions}
    return getattr(records, cls_name)(**values)


def _nullable_paths(fields: tuple[FieldSpec, ...], version: int,
                    here: Path = ()) -> Iterator[tuple[Path, FieldSpec]]:
    for f in fields:
        if version not in f.versions:
            continue
        path = (*here, f.name)
        if f.nullable_versions is not None and version in f.nullable_versions:
            yield path, f
        if f.fields:
            yield from _nullable_paths(f.fields, version, path)


CASES = [(name, version, path, f) for name, version in EVERY_VERSION
         for path, f in _nullable_paths(CODECS[name].spec.fields, version)]


def test_the_cases_cover_every_kind_of_null() -> None:
    # Nullable structs are refused by the generator (no declaration here needs one).
    kinds = {"array" if f.is_array else f.type for *_, f in CASES}
    assert {"array", "string", "records"} <= kinds, kinds
    assert any(f.is_array and f.fields for *_, f in CASES)  # arrays of structs
    assert any(len(p) > 1 for _, _, p, _ in CASES)  # nested in a struct
    assert ("MetadataRequest", 12, ("Topics",)) in {(n, v, p) for n, v, p, _ in CASES}


@pytest.mark.parametrize(("name", "version", "path", "field"), CASES,
                         ids=[f"{n}-v{v}-{'.'.join(p)}" for n, v, p, _ in CASES])
def test_a_null_field_round_trips_with_the_fields_after_it(
        name: str, version: int, path: Path, field: FieldSpec) -> None:
    codec = CODECS[name]
    record = _struct(name, codec.spec.fields, version, path)
    payload = codec.encode(record, version=version)
    assert codec.decode(payload, version=version) == record  # strict: no byte left over
    # The same record with the field set instead differs: the null really travelled.
    assert payload != codec.encode(_struct(name, codec.spec.fields, version, ()),
                                   version=version)
    if field.tagged_versions is None and len(path) == 1 and path == (
            next(f.name for f in codec.spec.fields if version in f.versions),):
        # The message's first field: its null is at the payload's very start.
        compact = is_flexible(name, version) and (
            field.flexible_versions is None or version in field.flexible_versions)
        width = 2 if field.type == "string" else 4
        assert payload.startswith(b"\x00" if compact else b"\xff" * width)
