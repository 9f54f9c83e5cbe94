"""The spec engine's Kafka dialect on declarations written for the test: every type
(including those no shipped declaration uses: uint16, uint32, float64), a field that
becomes tagged, a struct field, nullable arrays of primitives, defaults in hex, and the
declaration errors the generator refuses."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from protocols.errors import ProtocolError
from protocols.generate import Target, generate
from protocols.spec import (
    NO_VERSIONS,
    TypeRegistry,
    VersionRange,
    leading_comment,
    load_json_with_comments,
    parse_spec,
)

EVERYTHING = """
// A message with every Kafka type.
{
  "apiKey": 99, "type": "request", "name": "EverythingRequest",
  "validVersions": "0-3", "flexibleVersions": "2+",
  "fields": [
    { "name": "Small", "type": "int8", "versions": "0+" },
    { "name": "Port", "type": "uint16", "versions": "0+" },
    { "name": "Count", "type": "uint32", "versions": "0+", "default": "0xffffffff" },
    { "name": "Big", "type": "int64", "versions": "0+", "default": "-1" },
    { "name": "Ratio", "type": "float64", "versions": "1+", "default": "0.5" },
    { "name": "Flag", "type": "bool", "versions": "0+", "default": "true" },
    { "name": "Id", "type": "uuid", "versions": "1+" },
    { "name": "Label", "type": "string", "versions": "0+", "nullableVersions": "1+",
      "default": "null" },
    { "name": "Blob", "type": "bytes", "versions": "0+" },
    { "name": "Batches", "type": "records", "versions": "0+", "nullableVersions": "0+" },
    { "name": "Offsets", "type": "[]int64", "versions": "0+", "nullableVersions": "3+" },
    { "name": "Names", "type": "[]string", "versions": "0+" },
    // Regular in versions 0 and 1, tagged from version 2.
    { "name": "Hint", "type": "int32", "versions": "0+", "taggedVersions": "2+", "tag": 5,
      "default": "7" },
    { "name": "Where", "type": "Place", "versions": "0+", "fields": [
      { "name": "Host", "type": "string", "versions": "0+", "default": "here" },
      { "name": "Extra", "type": "string", "versions": "2+", "taggedVersions": "2+",
        "tag": 0, "nullableVersions": "2+", "default": "null" }
    ]}
  ]
}
"""


def _module(tmp_path: Path, text: str) -> ModuleType:
    spec = parse_spec(load_json_with_comments(text), leading_comment(text.strip()))
    target = Target("protocols.kafka", "generated_for_test", "test", TypeRegistry("big"),
                    kafka=True)
    path = tmp_path / "generated_for_test.py"
    path.write_text(generate(target, [spec]))
    loader = importlib.util.spec_from_file_location("generated_for_test", path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    sys.modules["generated_for_test"] = module
    try:
        loader.loader.exec_module(module)
    finally:
        del sys.modules["generated_for_test"]
    return module


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return _module(tmp_path_factory.mktemp("gen"), EVERYTHING)


def test_defaults_follow_the_declaration(everything: ModuleType) -> None:
    record = everything.EverythingRequest()
    assert (record.count, record.big, record.ratio, record.flag, record.label, record.id,
            record.batches, record.hint, record.where) == (
        0xFFFFFFFF, -1, 0.5, True, None, bytes(16), None, 7, everything.Place("here", None))


def test_version_0_layout(everything: ModuleType) -> None:
    m = everything
    record = m.EverythingRequest(small=-2, port=65535, count=3, big=1 << 40, flag=False,
                                 label="ab", blob=b"\x01", batches=None, offsets=[5],
                                 names=["n"], hint=9, where=m.Place("h"))
    wire = m.encode_everything_request(record, 0)
    assert wire == bytes.fromhex(
        "fe" "ffff" "00000003" "0000010000000000" "00" "0002") + b"ab" + bytes.fromhex(
        "00000001" "01" "ffffffff" "00000001" "0000000000000005" "00000001" "0001"
        ) + b"n" + bytes.fromhex("00000009" "0001") + b"h"
    assert m.decode_everything_request(wire, 0) == record


def test_version_3_layout_with_tags(everything: ModuleType) -> None:
    m = everything
    record = m.EverythingRequest(small=1, port=2, count=3, big=4, ratio=math.pi, flag=True,
                                 id=bytes(range(16)), label=None, blob=b"", batches=b"xy",
                                 offsets=None, names=[], hint=300, where=m.Place("h", "e"))
    wire = m.encode_everything_request(record, 3)
    assert wire == (bytes.fromhex("01" "0002" "00000003" "0000000000000004")
                    + bytes.fromhex("400921fb54442d18") + b"\x01" + bytes(range(16))
                    + b"\x00" + b"\x01" + b"\x03xy" + b"\x00" + b"\x01"
                    + b"\x02h" + bytes.fromhex("01" "00" "02" "02") + b"e"  # Place, tag 0
                    + bytes.fromhex("01" "05" "04" "0000012c"))  # tag 5: Hint = 300
    assert m.decode_everything_request(wire, 3) == record
    # Hint at its default is not written at all.
    plain = m.encode_everything_request(m.EverythingRequest(), 3)
    assert plain.endswith(b"\x00\x00")  # Place's tags, then the message's: none


def test_values_that_do_not_fit_raise_value_error(everything: ModuleType) -> None:
    m = everything
    with pytest.raises(ValueError):
        m.encode_everything_request(m.EverythingRequest(port=70000), 0)
    with pytest.raises(ValueError, match="label is null"):
        m.encode_everything_request(m.EverythingRequest(label=None), 0)
    with pytest.raises(ValueError, match="ratio"):  # not ignorable, absent from v0
        m.encode_everything_request(m.EverythingRequest(label="", ratio=1.0), 0)


def test_bad_input_is_a_protocol_error(everything: ModuleType) -> None:
    m = everything
    wire = m.encode_everything_request(m.EverythingRequest(label="x"), 1)
    for cut in range(len(wire)):
        with pytest.raises(ProtocolError):
            m.decode_everything_request(wire[:cut], 1)


def _generate_error(tmp_path: Path, fields: str) -> str:
    text = ('{"apiKey": 1, "type": "request", "name": "BadRequest", "validVersions": "0-2",'
            f' "flexibleVersions": "1+", "fields": [{fields}]}}')
    with pytest.raises(ValueError) as info:
        _module(tmp_path, text)
    return str(info.value)


@pytest.mark.parametrize(("fields", "message"), [
    ('{"name": "A", "type": "int32", "versions": "0+", "tag": 1}', "go together"),
    ('{"name": "A", "type": "int32", "versions": "0+", "nullableVersions": "0+"}',
     "nullable"),
    ('{"name": "A", "type": "string", "versions": "0+", "default": "null"}', "never nullable"),
    ('{"name": "A", "type": "int8", "versions": "0+", "default": "300"}', "range"),
    ('{"name": "A", "type": "money", "versions": "0+"}', "unknown type"),
    ('{"name": "A", "type": "int8", "versions": "1+", "taggedVersions": "1+", "tag": 0},'
     '{"name": "B", "type": "int8", "versions": "1+", "taggedVersions": "1+", "tag": 0}',
     "tag 0 used twice"),
    ('{"name": "A", "type": "int8", "versions": "0+", "color": "red"}', "unknown keys"),
])
def test_declaration_errors(tmp_path: Path, fields: str, message: str) -> None:
    assert message in _generate_error(tmp_path, fields)


def test_none_is_the_empty_version_range() -> None:
    none = VersionRange.parse("none")
    assert none is NO_VERSIONS and none.empty and str(none) == "none"
    assert all(v not in none for v in range(5))


def test_comments_are_kept_as_the_docstring(everything: ModuleType) -> None:
    doc: Any = everything.EverythingRequest.__doc__
    assert "every Kafka type" in doc
