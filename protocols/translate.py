"""Figg frames to Tank bundles and back, without a Python object per message.

The two hot paths of the gateway cross the protocols here:

- :func:`scan_publishes`: every complete frame a Figg client sent, in one pass. Consecutive
  PUBLISHes to one topic come out as one :class:`PublishBatch`: their values already laid
  out as a Tank message set, and the ACK frames that will answer them;
- :func:`data_frames`: a run of framed Tank bundles (a Consume chunk, a segment range) as the
  Figg DATA frames that deliver its messages.

Each has a pure-Python reference (``*_py``, built on the message codecs) and, when the
extension is built, a compiled twin in ``protocols._speedups`` that gives the same results
and raises the same errors (the differential tests hold them to that). The public names
are whichever is in use (see :mod:`protocols.native`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from protocols.errors import FrameTooLarge, ProtocolError
from protocols.figg.messages import FAST, HEADER, REQUESTS, VERSION, MessageType
from protocols.native import speedups
from protocols.tank.bundle import MAX_BUNDLE_SIZE, MAX_UNCOMPRESSED_SIZE, decode_chunk
from protocols.wire import U64LE, encode_varint

__all__ = [
    "DataFrames", "PublishBatch", "data_frames", "data_frames_py", "plain_bundle_head",
    "refusal", "scan_publishes", "scan_publishes_py",
]

#: Flags of a message that carries its own timestamp (the first of a batch) and of one that
#: reuses the previous message's (Tank's UseLastSpecifiedTS).
_WITH_TIMESTAMP: Final = b"\x00"
_LAST_TIMESTAMP: Final = b"\x02"
_ACK: Final = struct.Struct(">HHIQ")
_ACK_PAYLOAD: Final = 8
_DATA_HEAD: Final = struct.Struct(">HHII")
_DATA_TAIL: Final = struct.Struct(">QI")
_decode_publish = FAST[MessageType.PUBLISH].decode


@dataclass(slots=True)
class PublishBatch:
    """Consecutive PUBLISH frames of one connection to one topic, translated for the log.

    ``message_set`` is a plain (uncompressed) Tank message set of ``count`` messages: the
    first carries the batch's timestamp, the others reuse it. ``acks`` holds the ``count``
    ACK frames that answer the PUBLISHes, in order.
    """

    topic: str
    count: int
    message_set: bytes
    acks: bytes


@dataclass(slots=True)
class DataFrames:
    """What :func:`data_frames` made of a chunk (the fields of ``ChunkResult`` but the
    messages, which come as ``frames``)."""

    #: DATA frames of the messages with ``seq >= min_seq``, joined.
    frames: bytes
    #: How many frames ``frames`` holds.
    count: int
    next_seq: int
    consumed: int
    partial_bundle_len: int | None


def plain_bundle_head(count: int) -> bytes:
    """The header of a plain, uncompressed Tank bundle of ``count`` messages: put it in front
    of the message sets of :class:`PublishBatch`\\ es to make a bundle."""
    if count <= 0:
        raise ValueError("a bundle holds at least one message")
    if count <= 15:
        return bytes((count << 2,))
    return b"\x00" + encode_varint(count)


def refusal(message_type: int, peer: str = "client") -> ProtocolError:
    """The error for a frame a Figg server does not take from a client (or a client from
    a server, with ``peer="server"``): an unknown type or one sent the wrong way. The
    header's version is never a reason: the real Figg server ignores it."""
    try:
        name = MessageType(message_type).name
    except ValueError:
        return ProtocolError(f"unknown Figg message type {message_type}")
    return ProtocolError(f"{name} is not sent by a Figg {peer}")


# --------------------------------------------------------------------------- PUBLISH


ScanResult = tuple[list[Any], int, ProtocolError | None]


def scan_publishes_py(buf: bytes | bytearray, pos: int, end: int, max_payload: int,
                      timestamp: int) -> ScanResult:
    """Read every complete frame a Figg client sent in ``buf[pos:end]``.

    Returns ``(items, pos, error)``: ``items`` holds a :class:`PublishBatch` for each run of
    consecutive PUBLISHes to one topic and ``(message_type, payload)`` for any other frame
    (ATTACH, DETACH, PING: their payloads are for the message codecs); ``pos`` is where the
    first incomplete frame starts. The first bad frame stops the scan: ``error`` is its
    :class:`ProtocolError` (a payload over ``max_payload``: :class:`FrameTooLarge`, as soon
    as its header is in), the items before it are returned, and ``pos`` is meaningless.
    ``timestamp`` (u64 milliseconds) goes into the message sets.
    """
    items: list[Any] = []
    header = HEADER
    run: list[Any] = []  # the PUBLISH records of the open batch
    try:
        while end - pos >= header.size:
            message_type, _version, length = header.unpack_from(buf, pos)
            if length > max_payload:
                raise FrameTooLarge(f"frame payload of {length} bytes exceeds the maximum "
                                    f"of {max_payload}")
            start = pos + header.size
            if end - start < length:
                break
            if message_type not in REQUESTS:  # any version: the real server ignores it
                raise refusal(message_type)
            payload = bytes(buf[start:start + length])
            if message_type == MessageType.PUBLISH:
                record = _decode_publish(payload)
                if run and run[0].topic != record.topic:
                    items.append(_batch(run, timestamp))
                    run = []
                run.append(record)
            else:
                if run:
                    items.append(_batch(run, timestamp))
                    run = []
                items.append((message_type, payload))
            pos = start + length
    except ProtocolError as exc:
        if run:
            items.append(_batch(run, timestamp))
        return items, pos, exc.with_traceback(None)  # its frames would hold ``buf``
    if run:
        items.append(_batch(run, timestamp))
    return items, pos, None


def _batch(run: list[Any], timestamp: int) -> PublishBatch:
    parts = [_WITH_TIMESTAMP, U64LE.pack(timestamp)]
    for i, record in enumerate(run):
        if i:
            parts.append(_LAST_TIMESTAMP)
        parts += (encode_varint(len(record.data)), record.data)
    acks = b"".join(_ACK.pack(MessageType.ACK, VERSION, _ACK_PAYLOAD, r.seq_num) for r in run)
    return PublishBatch(run[0].topic, len(run), b"".join(parts), acks)


def _scan_publishes_native(buf: bytes | bytearray, pos: int, end: int, max_payload: int,
                           timestamp: int) -> ScanResult:
    assert speedups is not None
    items, pos, error = speedups.scan_publishes(buf, pos, end, max_payload, timestamp)
    # Runs come as (topic bytes, count, message set, acks): the topic is checked and
    # decoded here, once per run.
    for i, item in enumerate(items):
        if len(item) == 4:
            topic, count, message_set, acks = item
            try:
                name = topic.decode()
            except UnicodeDecodeError:
                return items[:i], pos, ProtocolError("Publish.topic is not UTF-8")
            items[i] = PublishBatch(name, count, message_set, acks)
    return items, pos, error


scan_publishes: Callable[[bytes | bytearray, int, int, int, int], ScanResult] = (
    scan_publishes_py if speedups is None else _scan_publishes_native)


# ------------------------------------------------------------------------------ DATA


def data_frames_py(topic: bytes, chunk: bytes | memoryview, base_seq: int | None,
                   min_seq: int = 0, *, max_bundle_size: int = MAX_BUNDLE_SIZE,
                   max_uncompressed: int = MAX_UNCOMPRESSED_SIZE) -> DataFrames:
    """The DATA frames (for ``topic``, UTF-8 encoded) of the messages in ``chunk``.

    Decodes like :func:`protocols.tank.bundle.decode_chunk` (same arguments, same errors,
    same ``next_seq``/``consumed``/``partial_bundle_len``); each message with
    ``seq >= min_seq`` becomes ``DATA(topic, seq, value)``.
    """
    result = decode_chunk(chunk, base_seq, min_seq, max_bundle_size=max_bundle_size,
                          max_uncompressed=max_uncompressed)
    head, tail = _DATA_HEAD.pack, _DATA_TAIL.pack
    n = len(topic)
    parts: list[bytes] = []
    for m in result.messages:
        value = m.value
        parts += (head(MessageType.DATA, VERSION, n + len(value) + 16, n), topic,
                  tail(m.seq, len(value)), value)
    return DataFrames(b"".join(parts), len(result.messages), result.next_seq,
                      result.consumed, result.partial_bundle_len)


def _data_frames_native(topic: bytes, chunk: bytes | memoryview, base_seq: int | None,
                        min_seq: int = 0, *, max_bundle_size: int = MAX_BUNDLE_SIZE,
                        max_uncompressed: int = MAX_UNCOMPRESSED_SIZE) -> DataFrames:
    assert speedups is not None
    return DataFrames(*speedups.data_frames(topic, chunk, base_seq, min_seq,
                                            max_bundle_size, max_uncompressed))


data_frames: Callable[..., DataFrames] = (
    data_frames_py if speedups is None else _data_frames_native)
