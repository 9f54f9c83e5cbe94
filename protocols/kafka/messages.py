"""Kafka's declared messages by API key, and which header version each one travels with.

A request whose version is flexible carries request header version 2 (tagged fields after
the client id), else version 1; its response carries response header version 1 when
flexible, else 0, except an ApiVersions response, always version 0 (a client reads it
before it knows what the broker speaks).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final

from protocols.kafka.records import FLEXIBLE_VERSIONS, PAYLOAD_CODECS, READERS
from protocols.kafka.types import ApiKey
from protocols.record import Record
from protocols.spec import MessageCodec, load_package_codecs, trailing

#: Every declared message's codec, by name (``"FetchRequest"``, ``"RequestHeader"``, ...).
CODECS: Final[dict[str, MessageCodec[Any]]] = load_package_codecs("protocols.kafka",
                                                                   PAYLOAD_CODECS)
#: The request and response codecs by API key.
REQUESTS: Final = MappingProxyType({c.api_key: c for c in CODECS.values()
                                    if c.spec.kind == "request"})
RESPONSES: Final = MappingProxyType({c.api_key: c for c in CODECS.values()
                                     if c.spec.kind == "response"})
#: ``(min, max)`` version of every API key this package can decode, as ApiVersions tells.
SUPPORTED_VERSIONS: Final = MappingProxyType({
    key: (c.spec.valid_versions.low, c.spec.valid_versions.high)
    for key, c in sorted(REQUESTS.items())})


def is_flexible(name: str, version: int) -> bool:
    """Whether ``version`` of the message ``name`` is a flexible one."""
    flexible = FLEXIBLE_VERSIONS[name]
    return flexible is not None and flexible[0] <= version and (
        flexible[1] is None or version <= flexible[1])


#: Header versions worked out so far, by (API key, version): asked for every request and
#: answer (a few hundred pairs at most: unknown keys raise before they are kept).
_REQUEST_HEADERS: dict[tuple[int, int], int] = {}
_RESPONSE_HEADERS: dict[tuple[int, int], int] = {}


def request_header_version(api_key: int, version: int) -> int:
    """The request header version a request of ``api_key``/``version`` carries."""
    known = _REQUEST_HEADERS.get((api_key, version))
    if known is None:
        known = 2 if is_flexible(REQUESTS[api_key].name, version) else 1
        _REQUEST_HEADERS[api_key, version] = known
    return known


def response_header_version(api_key: int, version: int) -> int:
    """The response header version the answer to ``api_key``/``version`` carries."""
    known = _RESPONSE_HEADERS.get((api_key, version))
    if known is None:
        if api_key == ApiKey.API_VERSIONS:
            known = 0
        else:
            known = 1 if is_flexible(RESPONSES[api_key].name, version) else 0
        _RESPONSE_HEADERS[api_key, version] = known
    return known


def decode_response_at(api_key: int, frame: bytes, pos: int, version: int) -> Record:
    """The answer to ``api_key``/``version`` that fills ``frame[pos:]`` (what follows its
    response header), read in place by the generated reader: ``RESPONSES[api_key].decode``
    of that slice, without copying it first (a Fetch answer is megabytes; its records
    stay views of ``frame``). Every byte must belong to the answer; bad input raises
    ``ProtocolError``."""
    name = RESPONSES[api_key].name
    result, end = READERS[name](frame, pos, len(frame), version)
    if end != len(frame):
        raise trailing(name, len(frame) - end)
    answer: Record = result
    return answer


__all__ = ["CODECS", "REQUESTS", "RESPONSES", "SUPPORTED_VERSIONS", "decode_response_at",
           "is_flexible", "request_header_version", "response_header_version"]
