"""The spec engine: declarations generate codecs with versions, arrays and custom types.

The generator's output for a sample declaration is loaded here as a module, the way
``protocols/*/records.py`` are generated and imported.
"""

import struct
import sys
import types
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.errors import ProtocolError
from protocols.generate import Target, generate
from protocols.record import replace
from protocols.spec import (
    CustomType,
    MessageCodec,
    TypeRegistry,
    VersionRange,
    load_json_with_comments,
    parse_spec,
)
from protocols.wire import Reader

DECLARATION = """
// A Tank-like request with a versioned field and nested arrays.
{
  "name": "SampleRequest", "apiKey": 9, "type": "request",
  "validVersions": "0-3", "versionField": "version",
  "fields": [
    {"name": "version", "type": "uint16"},
    {"name": "request_id", "type": "uint32"},
    {"name": "client", "type": "str8"},
    {"name": "flags", "type": "uint8", "versions": "3+"},
    {"name": "topics", "type": "[]SampleTopic", "count": "uint8", "fields": [
      {"name": "name", "type": "str8"},
      {"name": "parts", "type": "[]SamplePart", "count": "uint8", "fields": [
        {"name": "id", "type": "uint16"},
        {"name": "seq", "type": "uint64"},
        {"name": "payload", "type": "varbytes"}
      ]}
    ]},
    {"name": "extra", "type": "[]uint16", "count": "rest"}
  ]
}
"""


class Doubled:
    """A custom type: a u8 stored doubled, to check custom types are wired in."""

    annotation = "int"
    default = 0

    def decode(self, reader: Reader, version: int, context: object) -> int:
        return reader.u8() * 2

    def encode(self, value: int, version: int, out: bytearray, context: object) -> None:
        out.append(value // 2)


#: The custom types the generated sample module imports from here.
CUSTOM_TYPES: dict[str, CustomType[Any]] = {"Doubled": Doubled()}


def compile_codec(raw: Mapping[str, Any], byteorder: str = "little") -> MessageCodec[Any]:
    """Generate the module of one declaration, load it, and return its codec."""
    spec = parse_spec(raw)
    name = f"_generated_{spec.name.lower()}"
    target = Target("tests", name, "Sample", TypeRegistry(byteorder, CUSTOM_TYPES),
                    custom_module=__name__)
    module = types.ModuleType(name)
    sys.modules[name] = module  # pickle looks the record classes up there
    exec(compile(generate(target, [spec]), f"<{name}>", "exec"), module.__dict__)
    return MessageCodec(spec, *module.PAYLOAD_CODECS[spec.name])


@pytest.fixture(scope="module")
def codec() -> MessageCodec[Any]:
    return compile_codec(load_json_with_comments(DECLARATION))


def sample(codec: MessageCodec, version: int = 3) -> Any:
    topic, part = codec.nested("topics"), codec.nested("topics", "parts")
    return codec.record(
        version=version, request_id=7, client="cli", flags=1 if version >= 3 else 0,
        topics=[topic(name="t", parts=[part(id=2, seq=5, payload=b"xy")])], extra=[1, 2])


def test_golden_bytes(codec: MessageCodec) -> None:
    expected = (struct.pack("<HI", 3, 7) + b"\x03cli" + b"\x01" + b"\x01" + b"\x01t" + b"\x01"
                + struct.pack("<HQ", 2, 5) + b"\x02xy" + struct.pack("<HH", 1, 2))
    assert codec.encode(sample(codec)) == expected
    assert codec.decode(expected) == sample(codec)


def test_field_absent_before_its_version(codec: MessageCodec) -> None:
    v2 = sample(codec, version=2)
    raw = codec.encode(v2)
    assert len(raw) == len(codec.encode(sample(codec))) - 1
    assert codec.decode(raw).flags == 0


def test_version_outside_valid_range(codec: MessageCodec) -> None:
    raw = bytearray(codec.encode(sample(codec)))
    raw[0:2] = struct.pack("<H", 4)
    with pytest.raises(ProtocolError, match="unsupported version"):
        codec.decode(bytes(raw))


def test_every_truncation_is_a_protocol_error(codec: MessageCodec) -> None:
    raw = codec.encode(sample(codec))
    without_rest = len(raw) - 4  # the trailing "rest" array may legally be cut at 2-byte steps
    for cut in range(without_rest):
        with pytest.raises(ProtocolError):
            codec.decode(raw[:cut])


def test_count_larger_than_payload_is_refused_early(codec: MessageCodec) -> None:
    raw = struct.pack("<HI", 3, 7) + b"\x00" + b"\x00" + b"\xff"
    with pytest.raises(ProtocolError, match="count 255"):
        codec.decode(raw)


def test_encode_rejects_out_of_range_values(codec: MessageCodec) -> None:
    bad = replace(sample(codec), request_id=1 << 32)
    with pytest.raises(ValueError):
        codec.encode(bad)


def test_custom_type_and_big_endian() -> None:
    spec = ({
        "name": "Custom", "apiKey": 1, "type": "response", "validVersions": "1",
        "fields": [{"name": "value", "type": "Doubled"}, {"name": "n", "type": "uint32"},
                   {"name": "topic", "type": "string"}, {"name": "blob", "type": "bytes"}]})
    codec = compile_codec(spec, "big")
    record = codec.record(value=10, n=258, topic="tö", blob=b"\x00")
    raw = codec.encode(record)
    assert raw == (b"\x05" + b"\x00\x00\x01\x02" + b"\x00\x00\x00\x03t\xc3\xb6"
                   + b"\x00\x00\x00\x01\x00")
    assert codec.decode(raw, version=1) == record
    with pytest.raises(ProtocolError, match="unsupported version"):
        codec.decode(raw, version=2)


def test_declaration_errors() -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        parse_spec({"name": "X", "apiKey": 1, "type": "request", "validVersions": "0",
                    "fields": [{"name": "a", "type": "uint8", "typo": 1}]})
    with pytest.raises(ValueError, match="unknown type"):
        compile_codec({"name": "X", "apiKey": 1, "type": "request", "validVersions": "0",
                       "fields": [{"name": "a", "type": "Nope"}]})


@pytest.mark.parametrize(("text", "inside", "outside"), [
    ("0+", [0, 5, 1 << 20], [-1]), ("1-3", [1, 2, 3], [0, 4]), ("2", [2], [1, 3]),
])
def test_version_ranges(text: str, inside: list[int], outside: list[int]) -> None:
    versions = VersionRange.parse(text)
    assert all(v in versions for v in inside)
    assert not any(v in versions for v in outside)


@given(
    version=st.integers(0, 3),
    request_id=st.integers(0, 2**32 - 1),
    client=st.text(max_size=40).filter(lambda s: len(s.encode()) < 256),
    topics=st.lists(st.tuples(
        st.text(min_size=1, max_size=20).filter(lambda s: len(s.encode()) < 256),
        st.lists(st.tuples(st.integers(0, 65535), st.integers(0, 2**64 - 1),
                           st.binary(max_size=300)), max_size=4)), max_size=4),
    extra=st.lists(st.integers(0, 65535), max_size=5),
)
def test_round_trip(codec: MessageCodec, version, request_id, client, topics, extra) -> None:
    topic, part = codec.nested("topics"), codec.nested("topics", "parts")
    record = codec.record(
        version=version, request_id=request_id, client=client,
        flags=7 if version >= 3 else 0, extra=extra,
        topics=[topic(name=n, parts=[part(id=i, seq=s, payload=p) for i, s, p in ps])
                for n, ps in topics])
    assert codec.decode(codec.encode(record)) == record
