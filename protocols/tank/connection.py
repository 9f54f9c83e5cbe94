"""The Tank connection state machine (sans-IO, after h11).

A frame is ``u8 msgId | u32 payloadLen`` (little-endian), then the payload. A
:class:`TankConnection` in the server role decodes requests and encodes responses; in the
client role it encodes requests, remembers each one until it is answered, and decodes
responses. Responses on one connection come in any order: the client role matches them to
their requests by request id and returns a :class:`Reply` holding both.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol, cast

from protocols.connection import (
    CLOSED,
    DEFAULT_MAX_FRAME,
    NEED_DATA,
    FramedConnection,
    FrameReader,
    Role,
    kept,
)
from protocols.errors import ProtocolError
from protocols.tank.bundle import MAX_UNCOMPRESSED_SIZE
from protocols.tank.messages import (
    REQUEST_TYPES,
    RESPONSE_CODECS,
    RESPONSE_ID,
    RESPONSE_TYPES,
    ConsumePeerRequest,
    ConsumePeerResponse,
    ConsumeResponse,
    MsgId,
    decode_request,
    decode_response,
    encode_payload,
)
from protocols.tank.scan import Appender, MakeBatch, produce_run, scan_requests
from protocols.tank.types import (
    CONSUME_PEER_RESPONSE_BODY,
    CONSUME_RESPONSE_BODY,
    ConsumeResponseBodyType,
)
from protocols.wire import U32LE

#: ``u8 msgId | u32 payloadLen``, little-endian.
FRAME_HEADER: Final = struct.Struct("<BI")

_CONSUME_BODY: Final = CONSUME_RESPONSE_BODY
_CONSUME_PEER_BODY: Final = CONSUME_PEER_RESPONSE_BODY


@dataclass(frozen=True, slots=True)
class Reply:
    """Client role: a decoded response and the request it answers."""

    request: Any
    response: Any


class _Answered(Protocol):
    """A request answered by a response that carries its id (all but ConsumePeer)."""

    @property
    def request_id(self) -> int: ...


def frame(msg_id: int, payload: bytes) -> bytes:
    """``u8 msgId | u32 payloadLen | payload``."""
    return FRAME_HEADER.pack(msg_id, len(payload)) + payload


def encode_consume_response_head(response: ConsumeResponse | ConsumePeerResponse) -> bytes:
    """The frame header and response header of a Consume (or ConsumePeer) response.

    Both lengths count the chunks, which the caller sends right after these bytes, in
    header order (for example with ``os.sendfile`` from the segment files). Each partition
    result gives its ``chunk_length``; chunk bytes are not needed (if present they only
    decide the length).
    """
    msg_id, body = _consume_body(response)
    head, chunks = body.encode_head(response)
    return FRAME_HEADER.pack(msg_id, len(head) + chunks) + head


def _consume_body(response: ConsumeResponse | ConsumePeerResponse
                  ) -> tuple[MsgId, ConsumeResponseBodyType]:
    if isinstance(response, ConsumeResponse):
        return MsgId.CONSUME, _CONSUME_BODY
    if isinstance(response, ConsumePeerResponse):
        return MsgId.CONSUME_PEER, _CONSUME_PEER_BODY
    raise TypeError(f"not a consume response: {response!r}")


def _consume_frame(response: ConsumeResponse | ConsumePeerResponse) -> bytes:
    """A whole Consume(Peer) response frame, joined once (chunks can be megabytes)."""
    msg_id, body = _consume_body(response)
    head, length = body.encode_head(response)
    return b"".join([FRAME_HEADER.pack(msg_id, len(head) + length), head,
                     *body.chunks(response)])


class TankConnection(FramedConnection):
    """One end of a Tank connection: bytes in, records out, records in, bytes out.

    Server role: :meth:`next_event` returns request records (``ProduceRequest``,
    ``ConsumeRequest``, ``Ping``, ...); :meth:`send` takes response records and ``Ping``
    (send one on accept, as the broker does).

    Client role: :meth:`send` takes request records and remembers those that get an answer;
    :meth:`next_event` returns a :class:`Reply` for each response, or ``Ping``. Requests
    still waiting are in :attr:`pending`.

    ``next_event`` returns :data:`~protocols.connection.NEED_DATA` when it needs more bytes
    and :data:`~protocols.connection.CLOSED` after a clean EOF. Bad input raises
    :class:`~protocols.errors.ProtocolError` (a frame over ``max_frame_size``:
    :class:`~protocols.errors.FrameTooLarge`, before its payload is buffered); the
    connection is then unusable and every later ``next_event`` raises too.
    """

    def __init__(self, role: Role, *, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self.role = role
        self._frames = FrameReader(FRAME_HEADER, 1, max_frame_size)
        self._pending: dict[int, object] = {}
        # ConsumePeer has no request id; made with the first (a client's only).
        self._pending_peer: deque[object] | None = None
        self._failure: ProtocolError | None = None

    @property
    def pending(self) -> Mapping[int, object]:
        """Client role: sent requests awaiting their response, by request id (read-only)."""
        return MappingProxyType(self._pending)

    def next_event(self) -> object:
        """The next request (server) or :class:`Reply`/``Ping`` (client), NEED_DATA or CLOSED."""
        if self._failure is not None:
            raise ProtocolError(f"connection already failed: {self._failure}")
        try:
            got = self._frames.next_frame()
            if got is NEED_DATA or got is CLOSED:
                return got
            (msg_id, _), payload = got
            if self.role is Role.SERVER:
                return decode_request(msg_id, payload)
            return self._decode_reply(msg_id, payload)
        except ProtocolError as exc:
            self._failure = kept(exc)
            raise

    def next_requests(self, make_batch: MakeBatch) -> tuple[list[Any], ProtocolError | None]:
        """Server role, the fast way: every complete request buffered, in one pass.

        A Produce comes as a :class:`~protocols.tank.scan.ProducePass` (its batches made
        with ``make_batch(topic, partition, bundle)``), every other request as its record;
        after a clean EOF the list ends with :data:`~protocols.connection.CLOSED`. Returns
        ``(requests, error)``: the error that stopped the pass (as :meth:`next_event` would
        raise it) comes after the requests read before it; the connection is then unusable.
        """
        if self.role is not Role.SERVER:
            raise RuntimeError("next_requests reads what clients send: server role only")
        if self._failure is not None:
            raise ProtocolError(f"connection already failed: {self._failure}")
        max_payload = self._frames.max_payload
        items, error = self._frames.scan(
            lambda buf, pos, end: scan_requests(buf, pos, end, max_payload, make_batch))
        return self._requests(items, error)

    def receive_requests(self, data: bytes | bytearray | memoryview, make_batch: MakeBatch,
                         start: int = 0) -> tuple[list[Any], ProtocolError | None]:
        """:meth:`receive_data` of ``data[start:]`` then :meth:`next_requests`, the same
        results; when no frame is partly buffered, the pass reads ``data`` where it is and
        only the incomplete frame at its end (if any) is buffered: a read of whole requests
        is not copied."""
        frames = self._frames
        if (start >= len(data) or frames.buffered or frames.eof or type(data) is not bytes
                or self.role is not Role.SERVER or self._failure is not None):
            frames.feed(data[start:] if start else data)
            return self.next_requests(make_batch)
        items, pos, error = scan_requests(data, start, len(data), frames.max_payload,
                                          make_batch)
        if error is None and pos < len(data):
            frames.feed(data[pos:])
        return self._requests(items, error)

    def rest_of_frame(self, data: bytes) -> int:
        """How many leading bytes of ``data`` (a read) end the frame begun in an earlier
        read: 0 when none was begun, more than ``len(data)`` when it does not end there."""
        return self._frames.rest_of_frame(data)

    def serve_produces(self, data: bytes, start: int,
                       appenders: Mapping[tuple[str, int], Appender], room: int
                       ) -> tuple[int, bytes, int]:
        """Server role: append and answer the run of Produces at ``data[start:]`` (a
        read) through ``appenders`` (:func:`~protocols.tank.scan.produce_run`), with at
        most about ``room`` response bytes; from ``start`` 0, a frame begun in an earlier
        read and ended in this one is the run's first. Returns ``(pos, responses,
        count)``: ``data[pos:]`` is left for :meth:`receive_requests` (from ``start`` when
        the run took nothing). Takes nothing once the connection has failed or ended, or
        while a frame is begun and ``start`` is not 0."""
        frames = self._frames
        if (frames.eof or self._failure is not None or self.role is not Role.SERVER
                or (start and frames.buffered)):
            return start, b"", 0
        max_payload = frames.max_payload
        first = b""
        count = 0
        if frames.buffered:
            completed = frames.completed_frame(data)
            if completed is None:
                return 0, b"", 0
            frame, start = completed
            _, first, count = produce_run(frame, 0, len(frame), max_payload, appenders,
                                          room, MAX_UNCOMPRESSED_SIZE)
            if not count:
                return 0, b"", 0
            frames.drop_buffered()
            room -= len(first)
        pos, responses, more = produce_run(data, start, len(data), max_payload, appenders,
                                           room, MAX_UNCOMPRESSED_SIZE)
        return pos, first + responses if first else responses, count + more

    def _requests(self, items: list[Any], error: ProtocolError | None
                  ) -> tuple[list[Any], ProtocolError | None]:
        """The pass's items with every frame that is not a Produce decoded."""
        for i, item in enumerate(items):
            if type(item) is tuple:
                try:
                    items[i] = decode_request(item[0], item[1])
                except ProtocolError as exc:
                    del items[i:]
                    error = exc
                    break
        if error is not None:
            self._failure = kept(error)
        return items, error

    def send(self, message: object) -> bytes:
        """The whole frame for ``message``; in the client role, also remember the request.

        Raises TypeError for a record this role does not send, ValueError for values that
        do not fit the wire or a request id that is already pending.
        """
        kind = type(message)
        allowed = RESPONSE_TYPES if self.role is Role.SERVER else REQUEST_TYPES
        if kind not in allowed:
            raise TypeError(f"a {self.role.value} does not send {kind.__name__}")
        if kind is ConsumeResponse or kind is ConsumePeerResponse:
            return _consume_frame(cast("ConsumeResponse | ConsumePeerResponse", message))
        msg_id, payload = encode_payload(message)
        if self.role is Role.CLIENT and kind in RESPONSE_ID:
            if kind is ConsumePeerRequest:
                if self._pending_peer is None:
                    self._pending_peer = deque()
                self._pending_peer.append(message)
            else:
                request_id = cast(_Answered, message).request_id
                if request_id in self._pending:
                    raise ValueError(f"request id {request_id} is already pending")
                self._pending[request_id] = message
        return frame(msg_id, payload)

    def _decode_reply(self, msg_id: int, payload: bytes) -> object:
        if msg_id not in RESPONSE_CODECS:
            raise ProtocolError(f"unknown Tank response msgId 0x{msg_id:02x}")
        if msg_id == MsgId.PING:
            return decode_response(msg_id, payload)
        if msg_id == MsgId.CONSUME_PEER:
            if not self._pending_peer:
                raise ProtocolError("ConsumePeer response without a pending request")
            request = self._pending_peer.popleft()
        else:
            request = self._pop_pending(msg_id, payload)
        return Reply(request, decode_response(msg_id, payload, request))

    def _pop_pending(self, msg_id: int, payload: bytes) -> object:
        offset = 4 if msg_id == MsgId.CONSUME else 0  # after the Consume header length
        if len(payload) < offset + 4:
            raise ProtocolError(f"response 0x{msg_id:02x} too short for its request id")
        request_id = U32LE.unpack_from(payload, offset)[0]
        request = self._pending.get(request_id)
        if request is None:
            raise ProtocolError(f"response 0x{msg_id:02x} to unknown request id {request_id}")
        if RESPONSE_ID[type(request)] != msg_id:
            raise ProtocolError(f"response 0x{msg_id:02x} to request {request_id}, a "
                                f"{type(request).__name__}")
        del self._pending[request_id]
        return request


__all__ = [
    "FRAME_HEADER", "Reply", "TankConnection", "encode_consume_response_head",
    "frame",
]
