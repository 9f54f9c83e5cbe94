"""Messages as JSON: what fetch, SSE and WebSocket send.

A message is ``{"topic", "partition", "offset", "timestamp", "key", "value"}``; a key or
value that is not UTF-8 text goes as ``key_base64`` / ``value_base64`` instead. The offset
is the Tank sequence number (the Figg offset).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from protocols.tank.bundle import ChunkResult as ChunkResult
from protocols.tank.bundle import Message, decode_chunk


def dumps(value: object) -> bytes:
    """Compact JSON bytes."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _field(out: dict[str, Any], name: str, data: bytes | None) -> None:
    if data is None:
        return
    try:
        out[name] = data.decode()
    except UnicodeDecodeError:
        out[f"{name}_base64"] = base64.b64encode(data).decode()


def message_json(topic: str, partition: int, message: Message) -> dict[str, Any]:
    """The JSON object of ``message`` of ``topic``/``partition``."""
    out: dict[str, Any] = {"topic": topic, "partition": partition, "offset": message.seq,
                           "timestamp": message.timestamp}
    _field(out, "key", message.key)
    _field(out, "value", message.value)
    return out


def payload_of(obj: dict[str, Any], name: str) -> bytes | None:
    """``obj[name]`` (text) or ``obj[name + "_base64"]`` as bytes; None when neither is
    there. Raises ValueError when one is there but not a string, or not base64."""
    text = obj.get(name)
    if text is not None:
        if not isinstance(text, str):
            raise ValueError(f"{name} must be a string")
        return text.encode()
    encoded = obj.get(f"{name}_base64")
    if encoded is None:
        return None
    if not isinstance(encoded, str):
        raise ValueError(f"{name}_base64 must be a string")
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        raise ValueError(f"{name}_base64 is not base64") from None


def decode_messages(chunk: bytes, base_seq: int | None, min_seq: int) -> ChunkResult:
    """The messages of a fetched chunk from ``min_seq`` on (a ProtocolError when the chunk
    can not be decoded)."""
    return decode_chunk(chunk, base_seq, min_seq)
