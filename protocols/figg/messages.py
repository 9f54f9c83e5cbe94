"""Figg's nine messages, compiled from the declarations in ``specs/``, and its frame header.

A frame is ``u16 type | u16 version | u32 payloadLen`` (big-endian, :data:`HEADER`;
``payloadLen`` excludes the 8 header bytes), then the payload. Every variable-size field,
topic names included, is ``u32 len | bytes``. Topics are declared ``string``: a topic that
is not UTF-8 is a :class:`~protocols.errors.ProtocolError`.

Each message has a record class (``Attach``, ``Attached``, ...: frozen, slotted
dataclasses with snake_case fields), its payload codec in :data:`CODECS` and its frame
codec in :data:`FAST` (what connections use). Both are generated from the declarations
into :mod:`protocols.figg.records` (``python -m protocols.generate``).
"""

from __future__ import annotations

import enum
import struct
from typing import Any, Final

from protocols.figg.records import (
    FLAT_CODECS,
    PAYLOAD_CODECS,
    Ack,
    Attach,
    Attached,
    Data,
    Detach,
    Detached,
    Ping,
    Pong,
    Publish,
)
from protocols.spec import FlatCodec, load_package_codecs

#: ``type | version | payloadLen``, big-endian; the length excludes the header.
HEADER: Final = struct.Struct(">HHI")
#: The only protocol version; it travels in the header, not in payloads.
VERSION: Final = 1
#: ATTACH flag: resume after the given offset (bit 15; the seed's "bit 1" is wrong).
ATTACH_FROM_OFFSET: Final = 0x8000


class MessageType(enum.IntEnum):
    """The ``type`` field of the frame header."""

    ATTACH = 1
    ATTACHED = 2
    DETACH = 3
    DETACHED = 4
    PUBLISH = 5
    ACK = 6
    DATA = 7
    PING = 8
    PONG = 9


#: Payload codecs by message name ("Attach", ...), generated from ``specs/*.json``.
CODECS: Final = load_package_codecs("protocols.figg", PAYLOAD_CODECS)
#: Payload codecs by message type.
CODEC_BY_TYPE: Final = {MessageType(c.api_key): c for c in CODECS.values()}
if sorted(CODEC_BY_TYPE) != list(MessageType) or len(CODECS) != len(MessageType):
    raise ImportError("the Figg declarations do not match MessageType")
for _codec in CODECS.values():
    if VERSION not in _codec.spec.valid_versions:
        raise ImportError(f"{_codec.name} is not declared for Figg version {VERSION}")

#: Frame codecs by message type (``decode``, ``encode_frame``, ``encode_record``).
FAST: Final[dict[MessageType, FlatCodec[Any]]] = {
    t: FLAT_CODECS[c.name] for t, c in CODEC_BY_TYPE.items()}
#: The message type of each record class.
TYPE_OF: Final[dict[type, MessageType]] = {c.record: t for t, c in CODEC_BY_TYPE.items()}

#: Messages a client sends (declared ``"request"``) and a server sends (``"response"``).
REQUESTS: Final = frozenset(t for t, c in CODEC_BY_TYPE.items() if c.spec.kind == "request")
RESPONSES: Final = frozenset(MessageType) - REQUESTS

__all__ = [
    "ATTACH_FROM_OFFSET", "CODECS", "CODEC_BY_TYPE", "FAST", "HEADER", "REQUESTS", "RESPONSES",
    "TYPE_OF", "VERSION", "Ack", "Attach", "Attached", "Data", "Detach", "Detached",
    "MessageType", "Ping", "Pong", "Publish",
]
