"""The server's one pass over a read: every complete Tank request frame in the buffer.

A Produce (msgId 0x01) comes out of the pass as a :class:`ProducePass`: the request's
fields, the layout its response follows and one backend batch per partition, made
without a Python record per topic or partition. Every other frame comes out as
``(msgId, payload)`` for :func:`~protocols.tank.messages.decode_request`.

:func:`scan_requests_py` is the reference; ``protocols._speedups.scan_tank_requests`` is
its compiled twin (:data:`scan_requests` is whichever is in use, see
:mod:`protocols.native`). Both return ``(items, pos, error)`` for
:meth:`~protocols.connection.FrameReader.scan` and give the same items and the same error
for the same bytes: a Produce payload the compiled pass does not read cleanly goes to the
reference decoder, whose error (or record) it then reports.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from protocols.errors import FrameTooLarge, ProtocolError
from protocols.native import speedups
from protocols.tank.bundle import validate_bundle_py
from protocols.tank.messages import MsgId, ProduceRequest
from protocols.tank.records import (
    ProducePartition,
    ProduceTopic,
    decode_produce_request,
)

#: ``make_batch(topic, partition, bundle)``: the backend's batch for one partition.
MakeBatch = Callable[[str, int, bytes], Any]
#: ``appender(bundle, message_count)``: append a validated plain bundle to its partition
#: now; False, having done nothing, when the general path must take it.
Appender = Callable[[bytes, int], bool]

_HEADER: Final = 5


class ProducePass(NamedTuple):
    """One Produce request as the pass read it."""

    client_version: int
    request_id: int
    client_id: str
    required_acks: int
    ack_timeout_ms: int
    #: ``(topic, (partition, ...))`` in request order: what the response's codes follow.
    layout: tuple[tuple[str, tuple[int, ...]], ...]
    #: ``make_batch(topic, partition, bundle)`` for every partition, in request order.
    batches: list[Any]
    #: Bundle bytes in all.
    size: int

    def as_request(self) -> ProduceRequest:
        """The :class:`ProduceRequest` record this pass was read from."""
        topics = []
        i = 0
        for name, partitions in self.layout:
            parts = []
            for partition in partitions:
                parts.append(ProducePartition(partition, self.batches[i].bundle))
                i += 1
            topics.append(ProduceTopic(name, parts))
        return ProduceRequest(self.client_version, self.request_id, self.client_id,
                              self.required_acks, self.ack_timeout_ms, topics)


def produce_pass(request: ProduceRequest, make_batch: MakeBatch) -> ProducePass:
    """The :class:`ProducePass` of a decoded ``request``."""
    layout = []
    batches = []
    size = 0
    for topic in request.topics:
        name = topic.name
        for part in topic.partitions:
            batches.append(make_batch(name, part.partition, part.bundle))
            size += len(part.bundle)
        layout.append((name, tuple(p.partition for p in topic.partitions)))
    return ProducePass(request.client_version, request.request_id, request.client_id,
                       request.required_acks, request.ack_timeout_ms, tuple(layout), batches,
                       size)


def scan_requests_py(buf: bytes | bytearray, pos: int, end: int, max_payload: int,
                     make_batch: MakeBatch) -> tuple[list[Any], int, ProtocolError | None]:
    """Every complete frame of ``buf[pos:end]``: a :class:`ProducePass` per Produce,
    ``(msgId, payload)`` for the others.

    Returns ``(items, pos, error)``: the items, where the first incomplete frame starts
    and the error that stopped the pass (a frame over ``max_payload``, checked before its
    payload is there, or a malformed Produce), the items before it kept.
    """
    items: list[Any] = []
    error: ProtocolError | None = None
    while end - pos >= _HEADER:
        msg_id = buf[pos]
        length = int.from_bytes(buf[pos + 1:pos + _HEADER], "little")
        if length > max_payload:
            error = FrameTooLarge(
                f"frame payload of {length} bytes exceeds the maximum of {max_payload}")
            break
        start = pos + _HEADER
        if end - start < length:
            break
        payload = bytes(buf[start:start + length])
        if msg_id == MsgId.PRODUCE:
            try:
                items.append(produce_pass(decode_produce_request(payload), make_batch))
            except ProtocolError as exc:
                error = exc
                break
        else:
            items.append((msg_id, payload))
        pos = start + length
    return items, pos, error


def _compiled_scan(buf: bytes | bytearray, pos: int, end: int, max_payload: int,
                   make_batch: MakeBatch) -> tuple[list[Any], int, ProtocolError | None]:
    assert speedups is not None
    result: tuple[list[Any], int, ProtocolError | None] = speedups.scan_tank_requests(
        buf, pos, end, max_payload, make_batch, ProducePass, _reference_produce)
    return result


def _reference_produce(payload: bytes, make_batch: MakeBatch) -> ProducePass:
    """What the compiled pass falls back on for a Produce payload it did not read cleanly:
    the reference decoder's pass, or its ProtocolError."""
    return produce_pass(decode_produce_request(payload), make_batch)


#: The pass in use: compiled when the extension is, else the reference.
scan_requests: Final = (scan_requests_py
                        if speedups is None or not hasattr(speedups, "scan_tank_requests")
                        else _compiled_scan)


#: A ProduceResponse frame of one topic with one partition, OK: ``msgId, payload
#: length, request id, code``.
_OK_RESPONSE: Final = struct.Struct("<BIIB")


def produce_run_py(buf: bytes | bytearray, pos: int, end: int, max_payload: int,
                   appenders: dict[tuple[str, int], Appender], room: int,
                   max_uncompressed: int) -> tuple[int, bytes, int]:
    """Append and answer the run of Produces that starts at ``buf[pos:end]``.

    Each complete Produce frame (within ``max_payload``) that decodes cleanly to one
    topic with one partition, for which ``appenders`` has an appender, whose bundle is
    valid and not sparse, and which the appender takes, is answered with an OK
    ProduceResponse frame; the run stops at the first frame that is anything else
    (left for the general path, which decodes it and says what is wrong with it) or once
    the responses reach ``room`` bytes. Returns ``(pos, responses, count)``: where the
    run stopped, the response frames and how many requests they answer.
    """
    responses = bytearray()
    count = 0
    while end - pos >= _HEADER and len(responses) < room:
        length = int.from_bytes(buf[pos + 1:pos + _HEADER], "little")
        start = pos + _HEADER
        if buf[pos] != MsgId.PRODUCE or length > max_payload or end - start < length:
            break
        try:
            request = decode_produce_request(bytes(buf[start:start + length]))
        except ProtocolError:
            break
        if len(request.topics) != 1 or len(request.topics[0].partitions) != 1:
            break
        topic = request.topics[0]
        part = topic.partitions[0]
        appender = appenders.get((topic.name, part.partition))
        if appender is None:
            break
        try:
            info = validate_bundle_py(part.bundle, max_uncompressed=max_uncompressed)
        except ProtocolError:
            break
        if info.sparse or not appender(part.bundle, info.msg_count):
            break
        responses += _OK_RESPONSE.pack(MsgId.PRODUCE, 5, request.request_id, 0)
        count += 1
        pos = start + length
    return pos, bytes(responses), count


#: The run in use: compiled when the extension is, else the reference.
produce_run: Final[Callable[..., tuple[int, bytes, int]]] = (
    produce_run_py if speedups is None or not hasattr(speedups, "tank_produce_run")
    else speedups.tank_produce_run)
