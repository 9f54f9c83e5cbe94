"""The Produce request and its answer, each made or read in one call, on both sides.

Every publish through a gateway in front of Kafka crosses them four times: the gateway's
upstream producer makes a request and reads its answer (:func:`produce_request`,
:func:`produce_answers`), the broker (figtank's Kafka listener) reads the request and
makes the answer (:func:`read_produce_request`, :func:`produce_response_frame`). The
generated codec (:mod:`protocols.kafka.records`) is the reference (the ``*_py``
functions). When the extension is built, each is one compiled call giving the same bytes
or the same records; what the compiled code does not take (tagged fields, record errors,
anything malformed or out of range) goes to the reference, which reads or makes it, or
raises its error. ``tests/protocols/kafka/test_produce_frames.py`` holds the two to each
other.
"""

from __future__ import annotations

import struct
from typing import Final, TypeAlias, cast

from protocols.kafka.messages import (
    decode_response_at,
    request_header_version,
    response_header_version,
)
from protocols.kafka.primitives import Parts
from protocols.kafka.records import (
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    RequestHeader,
    ResponseHeader,
    TopicProduceData,
    encode_produce_response,
    encode_request_header,
    encode_response_header,
    read_response_header,
    write_produce_request,
)
from protocols.kafka.records import read_produce_request as read_produce_request_py
from protocols.kafka.types import ApiKey
from protocols.native import speedups

__all__ = ["PartitionAnswer", "ProduceTopics", "produce_answers", "produce_answers_py",
           "produce_request", "produce_request_py", "produce_response_frame",
           "produce_response_frame_py", "read_produce_request", "read_produce_request_py"]

#: What a Produce carries: ``[(topic name, [(partition, record batches)])]``, names
#: UTF-8 encoded.
ProduceTopics: TypeAlias = list[tuple[bytes, list[tuple[int, bytes | None]]]]
#: One partition's answer: ``(topic, partition, error_code, base_offset,
#: log_append_time_ms, error_message)``.
PartitionAnswer: TypeAlias = tuple[str, int, int, int, int, str | None]

_SIZE: Final = struct.Struct(">i")


def produce_request_py(version: int, correlation: int, client_id: bytes | None, acks: int,
                       timeout_ms: int, topics: ProduceTopics) -> list[bytes | bytearray]:
    """The frame (size first) of a Produce request of ``version`` (3-9), no transactional
    id, as pieces: the record batches are pieces of their own (never copied)."""
    request = ProduceRequest(None, acks, timeout_ms, [
        TopicProduceData(name.decode(), [PartitionProduceData(partition, records)
                                         for partition, records in partitions])
        for name, partitions in topics])
    header = encode_request_header(
        RequestHeader(ApiKey.PRODUCE, version, correlation,
                      None if client_id is None else client_id.decode()),
        request_header_version(ApiKey.PRODUCE, version))
    out = Parts()
    write_produce_request(request, out, version)
    pieces = [bytes(piece) if type(piece) is memoryview else piece
              for piece in out.pieces() if piece]
    return [_SIZE.pack(len(header) + sum(map(len, pieces))) + header, *pieces]


def produce_answers_py(frame: bytes, version: int) -> list[PartitionAnswer]:
    """Every partition's answer in ``frame`` (an answer to a Produce of ``version``, its
    size taken off; its header is read, the correlation id left to the caller)."""
    _, pos = read_response_header(frame, 0, len(frame),
                                  response_header_version(ApiKey.PRODUCE, version))
    answer = cast(ProduceResponse, decode_response_at(ApiKey.PRODUCE, frame, pos, version))
    return [
        (topic.name, part.index, part.error_code, part.base_offset, part.log_append_time_ms,
         part.error_message)
        for topic in answer.responses for part in topic.partition_responses]


def produce_response_frame_py(version: int, correlation: int, response: ProduceResponse
                              ) -> bytes:
    """The whole frame (size first) answering a Produce of ``version`` with ``response``."""
    header = encode_response_header(ResponseHeader(correlation),
                                    response_header_version(ApiKey.PRODUCE, version))
    payload = encode_produce_response(response, version)
    return b"".join((_SIZE.pack(len(header) + len(payload)), header, payload))


def _produce_request_native(version: int, correlation: int, client_id: bytes | None,
                            acks: int, timeout_ms: int, topics: ProduceTopics
                            ) -> list[bytes | bytearray]:
    assert speedups is not None
    return speedups.kafka_produce_request(version, correlation, client_id, acks, timeout_ms,
                                          topics)


def _produce_answers_native(frame: bytes, version: int) -> list[PartitionAnswer]:
    assert speedups is not None
    read = speedups.kafka_produce_answers(frame, version)
    return produce_answers_py(frame, version) if read is None else read


def _read_produce_request_native(buf: bytes, pos: int, end: int, version: int
                                 ) -> tuple[ProduceRequest, int]:
    assert speedups is not None
    read = speedups.kafka_read_produce_request(buf, pos, end, version)
    if read is None:
        return read_produce_request_py(buf, pos, end, version)
    transactional_id, acks, timeout_ms, topics, pos = read
    return ProduceRequest(transactional_id, acks, timeout_ms, [
        TopicProduceData(name, [PartitionProduceData(index, records)
                                for index, records in partitions])
        for name, partitions in topics]), pos


def _produce_response_frame_native(version: int, correlation: int,
                                   response: ProduceResponse) -> bytes:
    assert speedups is not None
    made = speedups.kafka_produce_response(version, correlation, response)
    return produce_response_frame_py(version, correlation, response) if made is None else made


produce_request = produce_request_py if speedups is None else _produce_request_native
produce_answers = produce_answers_py if speedups is None else _produce_answers_native
read_produce_request = (read_produce_request_py if speedups is None
                        else _read_produce_request_native)
produce_response_frame = (produce_response_frame_py if speedups is None
                          else _produce_response_frame_native)
