"""The Kafka connection state machine, server side (sans-IO, after h11).

A frame is ``int32 size | payload`` (big-endian); a request payload is a request header
(API key, version, correlation id, client id; tagged fields when the version is flexible)
and the body. :class:`KafkaServerConnection` takes received bytes, returns one event per
complete request and encodes responses with the header version their request calls for.

A request whose API key or version this package does not declare is not an error: it
comes out as :class:`UnsupportedRequest`, so the listener can answer as Kafka does
(an ApiVersions request of a newer version gets an ApiVersions version 0 answer with
UNSUPPORTED_VERSION and the supported versions; for other APIs Kafka closes the
connection). Bytes after a request body's declared fields are ignored, as Kafka does.
Anything else malformed raises :class:`~protocols.errors.ProtocolError`.

After a SaslHandshake version 0 (KIP-43) the client sends its SASL tokens as raw frames,
``int32 size | token`` with no request header, and the server answers each the same way.
The owner switches the connection to that mode once it has accepted the handshake
(:meth:`KafkaServerConnection.read_sasl_tokens`), gets each frame as a :class:`SaslToken`,
and switches back when the exchange has succeeded (:meth:`~KafkaServerConnection.read_requests`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from protocols.connection import (
    CLOSED,
    DEFAULT_MAX_FRAME,
    NEED_DATA,
    FramedConnection,
    FrameReader,
    Sentinel,
    kept,
)
from protocols.errors import ProtocolError
from protocols.kafka.messages import (
    REQUESTS,
    RESPONSES,
    request_header_version,
    response_header_version,
)
from protocols.kafka.primitives import Buffer, Parts, read_nullable_string
from protocols.kafka.produce_frames import produce_response_frame, read_produce_request
from protocols.kafka.records import (
    READERS,
    WRITERS,
    ProduceResponse,
    ResponseHeader,
    encode_response_header,
    read_request_header,
)
from protocols.kafka.types import ApiKey
from protocols.record import Record

#: ``int32 size`` before every payload. Read unsigned, so that a negative size is simply
#: too large (FrameTooLarge) rather than a separate case.
#: A response body's pieces, sent as they are.
_B = TypeVar("_B", bound=Buffer)

FRAME_HEADER: Final = struct.Struct(">I")
_HEAD: Final = struct.Struct(">hhi")  # api key, api version, correlation id


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request: its header's fields and its body record."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: The request record of ``api_key`` (``ProduceRequest``, ...): its class depends on
    #: a value read off the wire, so its handler (chosen by that value) names it.
    body: Any


@dataclass(frozen=True, slots=True)
class UnsupportedRequest:
    """A request of an API key or version not declared here; its body is not decoded.

    ``client_id`` is None when the header did not carry a readable one.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class SaslToken:
    """One raw SASL token, framed by its size only (after a SaslHandshake version 0)."""

    token: bytes


def frame(payload: bytes) -> bytes:
    """``int32 size | payload``."""
    return FRAME_HEADER.pack(len(payload)) + payload


def decode_request(payload: bytes) -> Request | UnsupportedRequest:
    """One request payload (no size prefix) into an event; ProtocolError if malformed."""
    if len(payload) < _HEAD.size:
        raise ProtocolError(f"request of {len(payload)} bytes is too short for its header")
    api_key, api_version, correlation_id = _HEAD.unpack_from(payload, 0)
    codec = REQUESTS.get(api_key)
    if codec is None or api_version not in codec.spec.valid_versions:
        try:
            client_id, _ = read_nullable_string(payload, _HEAD.size, len(payload), False,
                                                True, "RequestHeader.client_id")
        except ProtocolError:
            client_id = None
        return UnsupportedRequest(api_key, api_version, correlation_id, client_id)
    end = len(payload)
    header, pos = read_request_header(payload, 0, end,
                                      request_header_version(api_key, api_version))
    # In place (no copy). Bytes after the declared fields are ignored, as Kafka's broker
    # ignores them (it reads the fields off the frame and drops the rest): librdkafka 2.x
    # relies on it, its Metadata request for all topics (v9+) carries 3 such bytes.
    if api_key == ApiKey.PRODUCE:  # on every publish: read in one call
        body, _ = read_produce_request(payload, pos, end, api_version)
    else:
        body, _ = READERS[codec.name](payload, pos, end, api_version)
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Record) -> bytes:
    """The whole frame of a response: size, header of the right version, body.

    ValueError for a body that does not fit ``api_version``.
    """
    if api_key == ApiKey.PRODUCE and type(body) is ProduceResponse:  # made in one call
        return produce_response_frame(api_version, correlation_id, body)
    codec = RESPONSES.get(api_key)
    if codec is None:
        raise ValueError(f"no response declared for API key {api_key}")
    header = encode_response_header(ResponseHeader(correlation_id),
                                    response_header_version(api_key, api_version))
    payload = codec.encode(body, version=api_version)
    # One copy of a (maybe large: Fetch) payload, not one per concatenation.
    return b"".join((FRAME_HEADER.pack(len(header) + len(payload)), header, payload))


def encode_response_parts(api_key: int, api_version: int, correlation_id: int, body: Record
                          ) -> list[Buffer]:
    """The frame of :func:`encode_response` as buffers to send in order: its large
    ``records`` values (a Fetch response's) are pieces of their own, not copied (see
    :class:`~protocols.kafka.primitives.Parts`); a response without any is one piece."""
    codec = RESPONSES.get(api_key)
    if codec is None:
        raise ValueError(f"no response declared for API key {api_key}")
    out = Parts()
    out += bytes(FRAME_HEADER.size)
    out += encode_response_header(ResponseHeader(correlation_id),
                                  response_header_version(api_key, api_version))
    WRITERS[codec.name](body, out, api_version)
    pieces = out.pieces()
    head = pieces[0]
    assert isinstance(head, bytearray)
    FRAME_HEADER.pack_into(head, 0, sum(map(len, pieces)) - FRAME_HEADER.size)
    return pieces


def encode_body_parts(api_key: int, body: Record, api_version: int) -> list[Buffer]:
    """A response body alone, as the pieces of :func:`encode_response_parts` after its
    header: to encode once and send to many requests with
    :meth:`KafkaServerConnection.send_body_parts`."""
    codec = RESPONSES.get(api_key)
    if codec is None:
        raise ValueError(f"no response declared for API key {api_key}")
    out = Parts()
    WRITERS[codec.name](body, out, api_version)
    return [piece for piece in out.pieces() if piece]


def encode_response_with_body(api_key: int, api_version: int, correlation_id: int,
                              body: Sequence[_B]) -> list[bytes | _B]:
    """The frame of :func:`encode_response_parts` from a body already encoded (by
    :func:`encode_body_parts` at ``api_version``): size and header, then ``body``'s
    pieces as they are."""
    header = encode_response_header(ResponseHeader(correlation_id),
                                    response_header_version(api_key, api_version))
    size = len(header) + sum(map(len, body))
    return [FRAME_HEADER.pack(size) + header, *body]


class KafkaServerConnection(FramedConnection):
    """The server end of a Kafka connection: bytes in, requests out, responses to bytes.

    :meth:`next_event` returns a :class:`Request` or :class:`UnsupportedRequest` (a
    :class:`SaslToken` between :meth:`read_sasl_tokens` and :meth:`read_requests`),
    :data:`~protocols.connection.NEED_DATA` when it needs more bytes, and
    :data:`~protocols.connection.CLOSED` after a clean EOF. Bad input raises
    :class:`~protocols.errors.ProtocolError` (a frame over ``max_frame_size``:
    :class:`~protocols.errors.FrameTooLarge`, before its payload is buffered); the
    connection is then unusable and every later ``next_event`` raises too.
    """

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self._frames = FrameReader(FRAME_HEADER, 0, max_frame_size)
        self._failure: ProtocolError | None = None
        self._raw_sasl = False

    @property
    def reading_sasl_tokens(self) -> bool:
        """Whether frames are read as raw SASL tokens (see :meth:`read_sasl_tokens`)."""
        return self._raw_sasl

    def read_sasl_tokens(self) -> None:
        """From the next frame on, every frame is a raw SASL token (a :class:`SaslToken`
        event; answer with :meth:`send_sasl_token`). Call it after accepting a
        SaslHandshake version 0, before asking for the next event: bytes the client sent
        after the handshake are already buffered and read in this mode."""
        self._raw_sasl = True

    def read_requests(self) -> None:
        """From the next frame on, frames are Kafka requests again (the SASL exchange
        started by a SaslHandshake version 0 has succeeded)."""
        self._raw_sasl = False

    def next_event(self) -> Request | UnsupportedRequest | SaslToken | Sentinel:
        """The next :class:`Request`, :class:`UnsupportedRequest` or :class:`SaslToken`,
        NEED_DATA or CLOSED."""
        if self._failure is not None:
            raise ProtocolError(f"connection already failed: {self._failure}")
        try:
            got = self._frames.next_frame()
            if got is NEED_DATA or got is CLOSED:
                return got
            _, payload = got
            if self._raw_sasl:
                return SaslToken(payload)
            return decode_request(payload)
        except ProtocolError as exc:
            self._failure = kept(exc)
            raise

    def send(self, request: Request | UnsupportedRequest, body: Record, *,
             version: int | None = None) -> bytes:
        """The whole frame answering ``request`` with ``body`` (a response record of its
        API key), at the request's version unless ``version`` says otherwise (the
        ApiVersions version 0 answer to an unsupported version)."""
        return encode_response(request.api_key,
                               request.api_version if version is None else version,
                               request.correlation_id, body)

    @staticmethod
    def send_sasl_token(token: bytes) -> bytes:
        """The raw frame answering a :class:`SaslToken`: ``int32 size | token``."""
        return frame(token)

    def send_parts(self, request: Request | UnsupportedRequest, body: Record) -> list[Buffer]:
        """:meth:`send` as the buffers of :func:`encode_response_parts`."""
        return encode_response_parts(request.api_key, request.api_version,
                                     request.correlation_id, body)

    def send_body_parts(self, request: Request | UnsupportedRequest, body: Sequence[_B]
                        ) -> list[bytes | _B]:
        """:meth:`send_parts` of a body already encoded at the request's version."""
        return encode_response_with_body(request.api_key, request.api_version,
                                         request.correlation_id, body)


__all__ = ["FRAME_HEADER", "KafkaServerConnection", "Request", "SaslToken",
           "UnsupportedRequest", "decode_request", "encode_body_parts", "encode_response",
           "encode_response_parts", "encode_response_with_body", "frame"]
