"""Raw SASL tokens after a SaslHandshake version 0 (KIP-43): the connection reads frames
as tokens between ``read_sasl_tokens`` and ``read_requests``, fed whole, byte by byte and
in random splits; the frame limit and EOF still apply; answers are size-framed tokens."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from protocols.connection import CLOSED, NEED_DATA
from protocols.errors import FrameTooLarge, ProtocolError
from protocols.kafka import records as r
from protocols.kafka.connection import KafkaServerConnection, Request, SaslToken, frame
from protocols.kafka.types import ApiKey
from tests.protocols.kafka.test_kafka_connection import request_bytes

SEED = 0x5A51


def login_stream(rng: random.Random, tokens: int) -> tuple[bytes, list[Any]]:
    """ApiVersions, SaslHandshake v0, ``tokens`` raw tokens (some empty, some that would
    parse as requests), then Metadata: the bytes and the events expected."""
    events: list[Any] = [Request(ApiKey.API_VERSIONS, 3, 1, "test",
                                 r.ApiVersionsRequest("c", "1")),
                         Request(ApiKey.SASL_HANDSHAKE, 0, 2, "test",
                                 r.SaslHandshakeRequest("SCRAM-SHA-256"))]
    wire = [request_bytes(ApiKey.API_VERSIONS, 3, 1, events[0].body),
            request_bytes(ApiKey.SASL_HANDSHAKE, 0, 2, events[1].body)]
    for i in range(tokens):
        if i % 5 == 0:
            token = b""
        elif i % 5 == 1:  # a whole request frame's payload: still just a token here
            token = request_bytes(ApiKey.METADATA, 9, 7, r.MetadataRequest())[4:]
        else:
            token = rng.randbytes(rng.randrange(1, 300))
        wire.append(frame(token))
        events.append(SaslToken(token))
    meta = Request(ApiKey.METADATA, 9, 3, "test", r.MetadataRequest(topics=[]))
    wire.append(request_bytes(ApiKey.METADATA, 9, 3, meta.body))
    events.append(meta)
    return b"".join(wire), events


def serve(stream: bytes, cuts: list[int], tokens: int) -> list[Any]:
    """Feed ``stream`` cut at ``cuts``, switching modes as a server does: raw tokens after
    the v0 handshake, requests again after ``tokens`` of them."""
    conn = KafkaServerConnection()
    events: list[Any] = []
    seen = 0

    def drain() -> Any:
        nonlocal seen
        while True:
            event = conn.next_event()
            if event is NEED_DATA or event is CLOSED:
                return event
            events.append(event)
            if isinstance(event, Request) and event.api_key == ApiKey.SASL_HANDSHAKE:
                conn.read_sasl_tokens()
            elif isinstance(event, SaslToken):
                seen += 1
                if seen == tokens:
                    conn.read_requests()

    start = 0
    for cut in [*cuts, len(stream)]:
        conn.receive_data(stream[start:cut])
        start = cut
        assert drain() is NEED_DATA
    conn.receive_data(b"")
    assert drain() is CLOSED
    return events


@pytest.mark.parametrize("how", ["whole", "byte by byte", "random splits"])
def test_three_way_feeding_of_a_raw_sasl_login(how: str) -> None:
    rng = random.Random(SEED)
    stream, expected = login_stream(rng, 12)
    if how == "whole":
        cuts: list[int] = []
    elif how == "byte by byte":
        cuts = list(range(1, len(stream)))
    else:
        cuts = sorted(rng.sample(range(1, len(stream)), 150))
    assert serve(stream, cuts, 12) == expected


def test_the_mode_is_reported_and_switches_both_ways() -> None:
    conn = KafkaServerConnection()
    assert not conn.reading_sasl_tokens
    conn.receive_data(frame(b"n,,n=alice,r=abc") + frame(b"\x00\x01"))
    conn.read_sasl_tokens()
    assert conn.reading_sasl_tokens
    assert conn.next_event() == SaslToken(b"n,,n=alice,r=abc")
    conn.read_requests()
    with pytest.raises(ProtocolError, match="too short"):  # a request again: 2 bytes
        conn.next_event()


def test_an_answer_is_the_token_framed_by_its_size() -> None:
    conn = KafkaServerConnection()
    assert conn.send_sasl_token(b"v=abc") == b"\x00\x00\x00\x05v=abc"
    assert conn.send_sasl_token(b"") == b"\x00\x00\x00\x00"  # PLAIN's empty answer


def test_the_frame_limit_applies_to_tokens() -> None:
    conn = KafkaServerConnection(max_frame_size=100)
    conn.read_sasl_tokens()
    conn.receive_data(frame(b"x" * 100))
    assert conn.next_event() == SaslToken(b"x" * 100)
    conn.receive_data(struct.pack(">I", 101))
    with pytest.raises(FrameTooLarge):
        conn.next_event()
    assert conn.buffered == 4  # refused before the payload came
    with pytest.raises(ProtocolError, match="already failed"):
        conn.next_event()


def test_a_negative_token_size_is_refused() -> None:
    conn = KafkaServerConnection()
    conn.read_sasl_tokens()
    conn.receive_data(struct.pack(">i", -5))
    with pytest.raises(FrameTooLarge):
        conn.next_event()


def test_eof_in_the_middle_of_a_token_is_an_error() -> None:
    conn = KafkaServerConnection()
    conn.read_sasl_tokens()
    conn.receive_data(frame(b"n,,n=alice,r=abc")[:-3])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(ProtocolError, match="middle of a frame"):
        conn.next_event()


def test_eof_between_tokens_is_a_clean_close() -> None:
    conn = KafkaServerConnection()
    conn.read_sasl_tokens()
    conn.receive_data(frame(b"t"))
    conn.receive_data(b"")
    assert conn.next_event() == SaslToken(b"t")
    assert conn.next_event() is CLOSED
