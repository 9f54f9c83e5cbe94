"""Our codecs against an independent implementation: kafka-python's ``kafka.protocol``
(a test dependency, used only here). For every message and version both declare, random
records that we encode (with their header) are decoded by kafka-python and encoded again
by it: the bytes must come back identical, so both read every field the same way."""

from __future__ import annotations

import random
from typing import Any

import kafka.protocol.admin  # registers the message classes
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer
import kafka.protocol.sasl  # noqa: F401
import pytest
from kafka.protocol.api_message import ApiMessage

from protocols.kafka.connection import decode_request, encode_response
from protocols.kafka.messages import CODECS
from protocols.record import replace
from tests.protocols.kafka.samples import random_record, versions_of
from tests.protocols.kafka.test_kafka_connection import request_bytes

ROUNDS = 25


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


THEIRS: dict[str, Any] = {c.__name__: c for c in _subclasses(ApiMessage)}
CASES = [(name, v) for name in sorted(CODECS) if name in THEIRS
         for v in versions_of(name)
         if THEIRS[name].min_version <= v <= THEIRS[name].max_version]


def test_every_api_is_compared() -> None:
    assert {n for n, _ in CASES} == {n for n, c in CODECS.items() if c.spec.kind != "header"}


@pytest.mark.parametrize(("name", "version"), CASES, ids=[f"{n}-v{v}" for n, v in CASES])
def test_kafka_python_reads_what_we_write(name: str, version: int) -> None:
    codec = CODECS[name]
    theirs = THEIRS[name]
    rng = random.Random(f"interop {name} {version}")
    for i in range(ROUNDS):
        record = random_record(name, version, rng)
        if name == "ApiVersionsResponse" and version > 0:
            # Clients read an ApiVersions answer with an error as version 0, since that
            # is how brokers send it: only error-free answers travel at a higher version.
            record = replace(record, error_code=0)
        if codec.spec.kind == "request":
            ours = request_bytes(codec.api_key, version, i, record, "interop")[4:]
            decoded = theirs.decode(ours, version=version, header=True)
            assert decoded.header.correlation_id == i
            assert bytes(decoded.encode(version=version, header=True)) == ours
            assert decode_request(ours).body == record
        else:
            ours = encode_response(codec.api_key, version, i, record)[4:]
            body = codec.encode(record, version=version)
            decoded = theirs.decode(ours, version=version, header=True)
            assert decoded.header.correlation_id == i
            decoded._header = None  # re-encode the body alone
            assert bytes(decoded.encode(version=version)) == body


def test_we_read_what_kafka_python_writes() -> None:
    """A request built with kafka-python's own classes, not from our records."""
    metadata = THEIRS["MetadataRequest"]
    request = metadata(topics=[metadata.MetadataRequestTopic(name="orders")],
                       allow_auto_topic_creation=False)
    request.with_header(correlation_id=11, client_id="kp")
    for version in range(0, 13):
        event = decode_request(bytes(request.encode(version=version, header=True)))
        assert (event.api_key, event.api_version, event.correlation_id, event.client_id) == (
            3, version, 11, "kp")
        assert [t.name for t in event.body.topics] == ["orders"]
        assert event.body.allow_auto_topic_creation is (version < 4)
