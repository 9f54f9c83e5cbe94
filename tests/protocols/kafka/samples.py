"""Random records of every declared Kafka message, built from the declarations."""

from __future__ import annotations

import random
from typing import Any

from protocols.codegen.core import snake
from protocols.kafka import records
from protocols.kafka.messages import CODECS
from protocols.spec import FieldSpec

_INT_RANGES = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_TEXT = "abcxyz.-_0189é☃"


def _nullable(f: FieldSpec, version: int) -> bool:
    return f.nullable_versions is not None and version in f.nullable_versions


def _primitive(kind: str, rng: random.Random) -> Any:
    if kind in _INT_RANGES:
        bits = _INT_RANGES[kind]
        return rng.choice([0, -1, 1, -(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                           rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1))])
    if kind == "uint16":
        return rng.randrange(1 << 16)
    if kind == "uint32":
        return rng.randrange(1 << 32)
    if kind == "float64":
        return rng.uniform(-1e9, 1e9)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "uuid":
        return rng.randbytes(16)
    if kind == "string":
        return "".join(rng.choice(_TEXT) for _ in range(rng.choice([0, 1, 5, 40])))
    return rng.randbytes(rng.choice([0, 1, 7, 200]))


def _value(f: FieldSpec, version: int, rng: random.Random, depth: int) -> Any:
    if _nullable(f, version) and rng.random() < 0.2:
        return None
    if f.is_array:
        count = rng.choice([0, 1, 2, 3]) if depth < 3 else rng.choice([0, 1])
        if f.fields:
            return [random_struct(f.element_type, f.fields, version, rng, depth + 1)
                    for _ in range(count)]
        return [_primitive(f.element_type, rng) for _ in range(count)]
    if f.fields:
        return random_struct(f.type, f.fields, version, rng, depth + 1)
    return _primitive(f.type, rng)


def random_struct(cls_name: str, fields: tuple[FieldSpec, ...], version: int,
                  rng: random.Random, depth: int = 0) -> Any:
    """A record of ``cls_name`` whose fields present in ``version`` hold random values
    (the others keep their defaults, as the version cannot carry them)."""
    values = {snake(f.name): _value(f, version, rng, depth)
              for f in fields if version in f.versions}
    return getattr(records, cls_name)(**values)


def random_record(name: str, version: int, rng: random.Random) -> Any:
    spec = CODECS[name].spec
    return random_struct(spec.name, spec.fields, version, rng)


def versions_of(name: str) -> list[int]:
    valid = CODECS[name].spec.valid_versions
    assert valid.high is not None
    return list(range(valid.low, valid.high + 1))


#: ``(message name, version)`` for every declared message at every valid version.
EVERY_VERSION = [(name, v) for name in sorted(CODECS) for v in versions_of(name)]
