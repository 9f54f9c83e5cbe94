"""Every declared Kafka message at every version: random records survive a round trip,
cut-short and overlong payloads raise ProtocolError, and a field a version lacks is
refused unless the declaration calls it ignorable."""

from __future__ import annotations

import random

import pytest

from protocols.errors import ProtocolError
from protocols.kafka import records
from protocols.kafka.messages import CODECS, decode_response_at
from tests.protocols.kafka.samples import EVERY_VERSION, random_record

ROUNDS = 40


@pytest.mark.parametrize(("name", "version"), EVERY_VERSION,
                         ids=[f"{n}-v{v}" for n, v in EVERY_VERSION])
def test_random_records_round_trip(name: str, version: int) -> None:
    codec = CODECS[name]
    rng = random.Random(f"{name}{version}")
    for _ in range(ROUNDS):
        record = random_record(name, version, rng)
        payload = codec.encode(record, version=version)
        assert codec.decode(payload, version=version) == record
        # Every proper prefix is refused (never a partial record), and so is a tail.
        for cut in {0, len(payload) // 2, len(payload) - 1} - {len(payload)}:
            if cut < 0:
                continue
            with pytest.raises(ProtocolError):
                codec.decode(payload[:cut], version=version)
        with pytest.raises(ProtocolError, match="trailing"):
            codec.decode(payload + b"\x00", version=version)


def test_versions_outside_the_declaration_are_refused() -> None:
    codec = CODECS["FetchRequest"]
    with pytest.raises(ProtocolError, match="unsupported version 13"):
        codec.decode(b"", version=13)
    with pytest.raises(ValueError, match="unsupported version 3"):
        codec.encode(records.FetchRequest(), version=3)


def test_a_field_the_version_lacks_is_refused_unless_ignorable() -> None:
    metadata = CODECS["MetadataRequest"]
    # AllowAutoTopicCreation (4+) is not ignorable: false cannot be said in version 3.
    with pytest.raises(ValueError, match="allow_auto_topic_creation"):
        metadata.encode(records.MetadataRequest(topics=None, allow_auto_topic_creation=False),
                        version=3)
    # ThrottleTimeMs (1+) is ignorable: dropped silently from a version 0 response.
    api_versions = CODECS["ApiVersionsResponse"]
    payload = api_versions.encode(records.ApiVersionsResponse(throttle_time_ms=5), version=0)
    assert api_versions.decode(payload, version=0).throttle_time_ms == 0


def test_null_is_refused_where_the_version_cannot_carry_it() -> None:
    metadata = CODECS["MetadataRequest"]
    with pytest.raises(ValueError, match="topics is null"):
        metadata.encode(records.MetadataRequest(topics=None), version=0)
    assert metadata.decode(metadata.encode(records.MetadataRequest(topics=None), version=1),
                           version=1).topics is None
    # A null where the declaration allows none: a protocol error, not a crash.
    with pytest.raises(ProtocolError, match="null where an array is required"):
        metadata.decode(b"\xff\xff\xff\xff", version=0)


def test_unknown_tagged_fields_are_skipped() -> None:
    codec = CODECS["ApiVersionsRequest"]
    plain = codec.encode(records.ApiVersionsRequest("c", "1"), version=3)
    assert plain.endswith(b"\x00")
    tagged = plain[:-1] + bytes([2, 40, 3]) + b"xyz" + bytes([41, 0])
    assert codec.decode(tagged, version=3) == records.ApiVersionsRequest("c", "1")
    with pytest.raises(ProtocolError, match="overruns"):
        codec.decode(plain[:-1] + bytes([1, 40, 9]) + b"xyz", version=3)


def test_a_known_tag_of_the_wrong_size_is_refused() -> None:
    codec = CODECS["ApiVersionsResponse"]
    body = codec.encode(records.ApiVersionsResponse(), version=3)[:-1]
    with pytest.raises(ProtocolError, match="wrong size"):
        codec.decode(body + bytes([1, 1, 9]) + bytes(9), version=3)  # int64 in 9 bytes


RESPONSE_VERSIONS = [(n, v) for n, v in EVERY_VERSION if CODECS[n].spec.kind == "response"]


@pytest.mark.parametrize(("name", "version"), RESPONSE_VERSIONS,
                         ids=[f"{n}-v{v}" for n, v in RESPONSE_VERSIONS])
def test_an_answer_read_in_place_equals_its_decoded_payload(name: str, version: int) -> None:
    """``decode_response_at`` (what figtank's upstream client reads answers with: the
    payload behind a header, not copied out first) against the codec's ``decode``."""
    codec = CODECS[name]
    rng = random.Random(f"at-{name}{version}")
    for _ in range(5):
        payload = codec.encode(random_record(name, version, rng), version=version)
        frame = b"HEAD" + payload
        assert decode_response_at(codec.api_key, frame, 4, version) == codec.decode(
            payload, version=version)
        with pytest.raises(ProtocolError, match="trailing"):
            decode_response_at(codec.api_key, frame + b"\x00", 4, version)
        if payload:
            with pytest.raises(ProtocolError):
                decode_response_at(codec.api_key, frame[:-1], 4, version)
