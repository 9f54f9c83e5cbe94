"""A client's Produce request and its answer: the compiled pair against the generated codec.

:func:`produce_request_py` and :func:`produce_answers_py` are the generated codec
(:mod:`protocols.kafka.records`) put to the gateway's use; the compiled
``kafka_produce_request`` must give the same bytes, and ``kafka_produce_answers`` the same
answers or None (an answer it leaves to the reference), for every version the gateway
speaks. Inputs: hypothesis requests (several topics and partitions, null, empty and large
record batches, UTF-8 names, a null client id) and answers (errors, messages, record
errors, tagged fields), each answer also cut at every byte and with a byte changed: the
wrapper the producer uses then reads what the reference reads, or raises its
``ProtocolError``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols import native
from protocols.errors import ProtocolError
from protocols.kafka import produce_frames as PF
from protocols.kafka.messages import response_header_version
from protocols.kafka.records import (
    BatchIndexAndErrorMessage,
    PartitionProduceResponse,
    ProduceResponse,
    ResponseHeader,
    TopicProduceResponse,
    encode_produce_response,
    encode_response_header,
)
from protocols.kafka.types import ApiKey

compiled = native.built("protocols._speedups")
VERSIONS = range(3, 10)
SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

names = st.text(min_size=1, max_size=12).map(str.encode).filter(lambda b: len(b) < 200)
batches = st.one_of(st.none(), st.just(b""), st.binary(max_size=40),
                    st.integers(1, 5000).map(lambda n: bytes(n % 251 for _ in range(n))))
topics = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 2**31 - 1), batches),
                                            max_size=4)), max_size=4)


@pytest.fixture(autouse=True, scope="module")
def _native_wrapper() -> Iterator[None]:
    # The wrapper calls the module's ``speedups``: the extension, also when
    # FIGTANK_PURE_PYTHON made the package ignore it (the pure pass compares too).
    with mock.patch.object(PF, "speedups", compiled):
        yield


def _reader() -> Callable[[bytes, int], object]:
    """What the producer reads answers with when the extension is there."""
    return PF.produce_answers_py if compiled is None else PF._produce_answers_native


def test_extension_is_built() -> None:
    if not native.pure_python_requested():
        assert compiled is not None and PF.produce_request is PF._produce_request_native


@SETTINGS
@given(version=st.sampled_from(VERSIONS), correlation=st.integers(0, 2**31 - 1),
       client_id=st.one_of(st.none(), names), acks=st.sampled_from([-1, 0, 1]),
       timeout_ms=st.integers(0, 2**31 - 1), topics=topics)
def test_the_compiled_request_is_the_generated_codecs(
        version: int, correlation: int, client_id: bytes | None, acks: int, timeout_ms: int,
        topics: PF.ProduceTopics) -> None:
    reference = b"".join(PF.produce_request_py(version, correlation, client_id, acks,
                                               timeout_ms, topics))
    assert int.from_bytes(reference[:4], "big") == len(reference) - 4
    if compiled is not None:
        pieces = compiled.kafka_produce_request(version, correlation, client_id, acks,
                                                timeout_ms, topics)
        assert b"".join(pieces) == reference
        kept = [r for _, parts in topics for _, r in parts if r]
        assert all(any(piece is r for piece in pieces) for r in kept)  # never copied


def _answer(version: int, correlation: int, parts: list[tuple[str, list[tuple[
        int, int, int, int, str | None, int]]]], tagged: bool) -> bytes:
    response = ProduceResponse([
        TopicProduceResponse(name, [
            PartitionProduceResponse(index, code, base, append_time, -1,
                                     [BatchIndexAndErrorMessage(0, "bad")] * errors
                                     if version >= 8 else [],
                                     message if version >= 8 else None)
            for index, code, base, append_time, message, errors in partitions])
        for name, partitions in parts], 7)
    frame = (encode_response_header(ResponseHeader(correlation),
                                    response_header_version(ApiKey.PRODUCE, version))
             + encode_produce_response(response, version))
    if tagged and version >= 9:  # one unknown tagged field in the answer's last byte
        frame = frame[:-1] + b"\x01\x05\x01\x00"
    return frame


answers = st.lists(st.tuples(
    st.text(min_size=1, max_size=10),
    st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(-1, 120),
                       st.integers(-1, 2**62), st.integers(-1, 2**40),
                       st.one_of(st.none(), st.text(max_size=20)),
                       st.sampled_from([0, 0, 0, 1])), max_size=3)), max_size=3)


def _same(read: Callable[[bytes, int], object], frame: bytes, version: int) -> None:
    """``read`` (what the producer uses) gives what the reference gives, or its error."""
    try:
        expected: object = PF.produce_answers_py(frame, version)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as raised:
            read(frame, version)
        assert (type(raised.value), str(raised.value)) == (type(exc), str(exc))
        return
    assert read(frame, version) == expected


@SETTINGS
@given(version=st.sampled_from(VERSIONS), correlation=st.integers(0, 2**31 - 1),
       parts=answers, tagged=st.booleans())
def test_the_compiled_answer_is_the_generated_codecs(
        version: int, correlation: int,
        parts: list[tuple[str, list[tuple[int, int, int, int, str | None, int]]]],
        tagged: bool) -> None:
    frame = _answer(version, correlation, parts, tagged)
    reference = PF.produce_answers_py(frame, version)
    assert len(reference) == sum(len(partitions) for _, partitions in parts)
    if compiled is None:
        return
    read = compiled.kafka_produce_answers(frame, version)
    unusual = (tagged and version >= 9) or (any(
        errors for _, partitions in parts for *_, errors in partitions) and version >= 8)
    assert read == (None if unusual else reference)
    _same(_reader(), frame, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_cut_or_changed_answer_reads_as_the_reference_reads_it(version: int) -> None:
    rng = random.Random(version)
    frame = _answer(version, 11, [("topic", [(0, 0, 5, -1, "m", 0), (1, 6, -1, -1, None, 0)]),
                                  ("é", [(2, 0, 9, 3, None, 0)])], tagged=False)
    for cut in range(len(frame) + 1):
        _same(_reader(), frame[:cut], version)
    for _ in range(400):
        changed = bytearray(frame)
        changed[rng.randrange(len(changed))] = rng.randrange(256)
        _same(_reader(), bytes(changed), version)


def _same_read(buf: bytes, version: int) -> None:
    """The broker's reader gives the reference's request and position, or its error."""
    read = (PF.read_produce_request_py if compiled is None
            else PF._read_produce_request_native)
    try:
        expected = PF.read_produce_request_py(buf, 0, len(buf), version)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as raised:
            read(buf, 0, len(buf), version)
        assert (type(raised.value), str(raised.value)) == (type(exc), str(exc))
        return
    assert read(buf, 0, len(buf), version) == expected


@SETTINGS
@given(version=st.sampled_from(VERSIONS), acks=st.sampled_from([-1, 0, 1, 7]),
       timeout_ms=st.integers(-2**31, 2**31 - 1), topics=topics)
def test_the_broker_reads_a_request_as_the_generated_codec(
        version: int, acks: int, timeout_ms: int, topics: PF.ProduceTopics) -> None:
    frame = b"".join(PF.produce_request_py(version, 5, b"c", acks, timeout_ms, topics))
    body = frame[4 + 8 + 2 + 1 + (1 if version >= 9 else 0):]  # size, header, client id "c"
    request, pos = PF.read_produce_request_py(body, 0, len(body), version)
    assert pos == len(body) and request.acks == acks
    assert [(t.name.encode(), [(p.index, None if p.records is None else bytes(p.records))
                               for p in t.partition_data])
            for t in request.topic_data] == [
        (name, [(index, records) for index, records in parts]) for name, parts in topics]
    if compiled is not None:
        read = compiled.kafka_read_produce_request(body, 0, len(body), version)
        assert read is not None
    _same_read(body, version)
    for cut in range(0, len(body), max(1, len(body) // 40)):
        _same_read(body[:cut], version)


responses = st.lists(st.tuples(
    st.text(min_size=1, max_size=10),
    st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(-1, 120),
                       st.integers(-1, 2**62), st.integers(-1, 2**40), st.integers(-1, 99),
                       st.one_of(st.none(), st.text(max_size=20)),
                       st.sampled_from([0, 0, 0, 1])), max_size=3)), max_size=3)


@SETTINGS
@given(version=st.sampled_from(VERSIONS), correlation=st.integers(0, 2**31 - 1),
       parts=responses, throttle=st.integers(0, 1000))
def test_the_broker_makes_an_answer_as_the_generated_codec(
        version: int, correlation: int, parts: list[tuple[str, list[tuple[
            int, int, int, int, int, str | None, int]]]], throttle: int) -> None:
    response = ProduceResponse([
        TopicProduceResponse(name, [
            PartitionProduceResponse(index, code, base, append_time, start,
                                     [BatchIndexAndErrorMessage(1, "bad")] * errors, message)
            for index, code, base, append_time, start, message, errors in partitions])
        for name, partitions in parts], throttle)
    reference = PF.produce_response_frame_py(version, correlation, response)
    if compiled is not None:
        made = compiled.kafka_produce_response(version, correlation, response)
        has_errors = any(errors for _, partitions in parts for *_, errors in partitions)
        assert made == (None if has_errors else reference)
        assert PF._produce_response_frame_native(version, correlation, response) == reference


def test_a_value_out_of_range_is_the_generated_codecs_error() -> None:
    response = ProduceResponse([TopicProduceResponse(
        "t", [PartitionProduceResponse(2**40, 0, 0, -1, -1, [], None)])], 0)
    with pytest.raises(ValueError) as expected:
        PF.produce_response_frame_py(9, 1, response)
    make = (PF.produce_response_frame_py if compiled is None
            else PF._produce_response_frame_native)
    with pytest.raises(ValueError) as raised:
        make(9, 1, response)
    assert str(raised.value) == str(expected.value)
