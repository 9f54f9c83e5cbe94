"""A raw Kafka peer for the tests: requests built with protocols.kafka, sent over a socket."""

from __future__ import annotations

import struct
from typing import Any

import trio

from protocols.kafka.messages import (
    REQUESTS,
    RESPONSES,
    request_header_version,
    response_header_version,
)
from protocols.kafka.records import RequestHeader, encode_request_header, read_response_header


def request(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """The whole frame of a request."""
    header = encode_request_header(RequestHeader(api_key, version, correlation_id, "raw"),
                                   request_header_version(api_key, version))
    payload = header + REQUESTS[api_key].encode(body, version=version)
    return struct.pack(">i", len(payload)) + payload


async def read_frame(stream: trio.SocketStream) -> bytes | None:
    """One response payload, or None at EOF."""
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data
    return buf[4:]


async def call(stream: trio.SocketStream, api_key: int, version: int, body: Any,
               correlation_id: int = 1, *, answer_version: int | None = None
               ) -> tuple[int, Any]:
    """Send one request and read its answer: ``(correlation id, response body)``."""
    await stream.send_all(request(api_key, version, correlation_id, body))
    payload = await read_frame(stream)
    assert payload is not None, "the connection closed"
    version = version if answer_version is None else answer_version
    header, pos = read_response_header(payload, 0, len(payload),
                                       response_header_version(api_key, version))
    return header.correlation_id, RESPONSES[api_key].decode(payload[pos:], version=version)
