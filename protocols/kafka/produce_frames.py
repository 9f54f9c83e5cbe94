"""A Kafka client's Produce request and the answer to it, each in one call.

The gateway's upstream producer sends one Produce per broker per round and reads one
answer per request, on the hot path of every publish. The generated codec
(:mod:`protocols.kafka.records`) is the reference: :func:`produce_request_py` and
:func:`produce_answers_py`. When the extension is built, :func:`produce_request` and
:func:`produce_answers` make the same bytes and read the same answers in one compiled call
each; an answer the compiled reader does not take (tagged fields, record errors, anything
malformed) goes to the reference, which reads it or raises its :class:`ProtocolError`.
``tests/protocols/kafka/test_produce_frames.py`` holds the two to each other.
"""

from __future__ import annotations

import struct
from typing import Final, TypeAlias

from protocols.kafka.messages import request_header_version, response_header_version
from protocols.kafka.primitives import Parts
from protocols.kafka.records import (
    PartitionProduceData,
    ProduceRequest,
    RequestHeader,
    TopicProduceData,
    decode_produce_response,
    encode_request_header,
    read_response_header,
    write_produce_request,
)
from protocols.kafka.types import ApiKey
from protocols.native import speedups

__all__ = ["PartitionAnswer", "ProduceTopics", "produce_answers", "produce_answers_py",
           "produce_request", "produce_request_py"]

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


def produce_answers_py(frame: bytes, version: int) -> tuple[int, list[PartitionAnswer]]:
    """The correlation id and every partition's answer in ``frame`` (an answer to a Produce
    of ``version``, its size taken off)."""
    header, pos = read_response_header(frame, 0, len(frame),
                                       response_header_version(ApiKey.PRODUCE, version))
    answer = decode_produce_response(memoryview(frame)[pos:], version)
    return header.correlation_id, [
        (topic.name, part.index, part.error_code, part.base_offset, part.log_append_time_ms,
         part.error_message)
        for topic in answer.responses for part in topic.partition_responses]


def _produce_request_native(version: int, correlation: int, client_id: bytes | None,
                            acks: int, timeout_ms: int, topics: ProduceTopics
                            ) -> list[bytes | bytearray]:
    assert speedups is not None
    return speedups.kafka_produce_request(version, correlation, client_id, acks, timeout_ms,
                                          topics)


def _produce_answers_native(frame: bytes, version: int) -> tuple[int, list[PartitionAnswer]]:
    assert speedups is not None
    read = speedups.kafka_produce_answers(frame, version)
    return produce_answers_py(frame, version) if read is None else read


produce_request = produce_request_py if speedups is None else _produce_request_native
produce_answers = produce_answers_py if speedups is None else _produce_answers_native
