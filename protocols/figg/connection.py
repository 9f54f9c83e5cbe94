"""The Figg connection state machine (sans-IO) and the fast DATA encoders.

A :class:`FiggConnection` keeps no socket: feed it received bytes, pull events, and turn
the events it sends into bytes (see :mod:`protocols.connection`). Every event is a record
from :mod:`protocols.figg.messages`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Final

from protocols.connection import (
    CLOSED,
    DEFAULT_MAX_FRAME,
    NEED_DATA,
    FramedConnection,
    FrameReader,
    Role,
    Sentinel,
    kept,
)
from protocols.errors import ProtocolError
from protocols.figg.messages import (
    FAST,
    HEADER,
    REQUESTS,
    RESPONSES,
    TYPE_OF,
)
from protocols.figg.records import encode_data_frames as _encode_data_frames
from protocols.record import Record
from protocols.translate import refusal, scan_publishes

_LENGTH_INDEX: Final = 2  # payloadLen in HEADER

def encode_data_frames(topic: bytes, items: Iterable[tuple[int, bytes]]) -> bytes:
    """Many DATA frames for one topic, joined: ``items`` yields ``(offset, data)``.

    ``topic`` is the UTF-8 encoded name. This is what a listener streaming a subscription
    calls: one ``struct.pack`` per frame, the data joined without intermediate copies.
    """
    return _encode_data_frames(topic, items)


@functools.cache
def _codecs(role: Role) -> tuple[dict[int, Callable[[bytes], Any]],
                                 dict[type, Callable[[Any], bytes]]]:
    """The decoders (by message type) of what ``role`` receives and the encoders (by
    record class) of what it sends."""
    inbound = REQUESTS if role is Role.SERVER else RESPONSES
    decoders: dict[int, Callable[[bytes], Any]] = {t: FAST[t].decode for t in inbound}
    encoders = {record: FAST[t].encode_record for record, t in TYPE_OF.items()
                if t not in inbound}
    return decoders, encoders


class FiggConnection(FramedConnection):
    """One end of a Figg connection.

    A ``Role.SERVER`` connection decodes what clients send (ATTACH, DETACH, PUBLISH, PING)
    and encodes the rest; a ``Role.CLIENT`` connection the reverse. Frames are sent with
    version 1 and decoded by their type whatever version they carry, as the real Figg
    server does (it ignores the field). Bad input (an unknown type, a message sent the
    wrong way, a payload that is short, has trailing bytes or a length that overruns it,
    a topic that is not UTF-8) raises
    :class:`ProtocolError`; a frame over ``max_frame_size`` raises
    :class:`~protocols.errors.FrameTooLarge` as soon as its header is in. After an error the
    connection is dead: every later ``next_event`` raises the same error.
    """

    __slots__ = ("_decoders", "_encoders", "_error", "role")

    def __init__(self, role: Role, *, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self.role = role
        self._frames = FrameReader(HEADER, _LENGTH_INDEX, max_frame_size)
        self._decoders, self._encoders = _codecs(role)  # one pair per role, shared
        self._error: ProtocolError | None = None

    def next_event(self) -> Record | Sentinel:
        """The next message from the peer, :data:`NEED_DATA`, or :data:`CLOSED` after a
        clean EOF."""
        events = self._read(1)
        return events[0] if events else NEED_DATA

    def next_events(self) -> list[Any]:
        """Every complete message buffered, in order, ending with :data:`CLOSED` if the
        peer closed cleanly after them; empty when more bytes are needed.

        This is the fast way to drain a large read. A bad frame after good ones is
        reported by the next call, so no message that came before it is lost.
        """
        return self._read(0)

    def next_batch(self, timestamp: int) -> list[Any]:
        """Server role, the fast way: like :meth:`next_events`, but each run of consecutive
        PUBLISHes to one topic comes as one :class:`~protocols.translate.PublishBatch`
        (values laid out as a Tank message set stamped with ``timestamp``, u64 ms, and the
        ACK frames that answer them), parsed without a Python object per message.
        """
        if self.role is not Role.SERVER:
            raise RuntimeError("next_batch reads what clients send: server role only")
        if self._error is not None:
            raise kept(self._error)
        max_payload = self._frames.max_payload
        items, error = self._frames.scan(
            lambda buf, pos, end: scan_publishes(buf, pos, end, max_payload, timestamp))
        decoders = self._decoders
        for i, item in enumerate(items):
            if type(item) is tuple:
                try:
                    items[i] = decoders[item[0]](item[1])
                except ProtocolError as exc:
                    del items[i:]
                    error = exc
                    break
        if error is not None:
            self._error = kept(error)
            if not items:
                try:
                    raise error
                finally:
                    del error  # else this frame and the error's traceback hold each other
        return items

    def _read(self, limit: int) -> list[Any]:
        """Decode up to ``limit`` frames (0: every complete one)."""
        if self._error is not None:
            raise kept(self._error)
        events: list[Any] = []
        append = events.append
        next_frame = self._frames.next_frame
        decoders = self._decoders
        try:
            while (frame := next_frame()) is not NEED_DATA:
                if frame is CLOSED:
                    append(CLOSED)
                    break
                (message_type, _version, _), payload = frame
                decode = decoders.get(message_type)
                if decode is None:
                    raise self._refusal(message_type)
                append(decode(payload))
                if len(events) == limit:
                    break
        except ProtocolError as exc:
            self._error = kept(exc)
            if not events:
                raise
        return events

    def send(self, event: object) -> bytes:
        """The whole frame (header and payload) for a message this role sends."""
        encode = self._encoders.get(type(event))
        if encode is None:
            what = type(event).__name__
            if type(event) in TYPE_OF:
                raise ValueError(f"a Figg {self.role.value} does not send {what}")
            raise TypeError(f"not a Figg message: {what}")
        return encode(event)

    def _refusal(self, message_type: int) -> ProtocolError:
        return refusal(message_type, "client" if self.role is Role.SERVER else "server")
