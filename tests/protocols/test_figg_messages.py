"""Figg messages and connection: golden bytes, three ways of feeding, round trips, bad input."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.connection import CLOSED, NEED_DATA, Role
from protocols.errors import FrameTooLarge, ProtocolError
from protocols.figg.connection import FiggConnection, encode_data_frames
from protocols.figg.messages import (
    ATTACH_FROM_OFFSET,
    CODEC_BY_TYPE,
    FAST,
    REQUESTS,
    TYPE_OF,
    Ack,
    Attach,
    Attached,
    Data,
    Detach,
    Detached,
    MessageType,
    Ping,
    Pong,
    Publish,
)

U64_MAX = 2**64 - 1

#: One whole DATA frame: ``encode_data(topic, offset, data)``; one ACK: ``encode_ack(seq)``.
encode_data = FAST[MessageType.DATA].encode_frame
encode_ack = FAST[MessageType.ACK].encode_frame


def h(text: str) -> bytes:
    """Bytes from hex written with spaces and ``|`` separators for readability."""
    return bytes.fromhex(text.replace("|", " "))


# Built by hand from the layouts in protocol-facts.md: type | version | payloadLen | payload.
GOLDEN: list[tuple[Any, bytes]] = [
    # The example in protocol-facts.md: ATTACH "t1" from offset 7.
    (Attach(flags=ATTACH_FROM_OFFSET, topic="t1", offset=7),
     h("0001 0001 00000010 | 8000 | 00000002 7431 | 0000000000000007")),
    (Attach(flags=0, topic="news", offset=0),
     h("0001 0001 00000012 | 0000 | 00000004 6e657773 | 0000000000000000")),
    (Attached(topic="t1", offset=7),
     h("0002 0001 0000000e | 00000002 7431 | 0000000000000007")),
    (Detach(topic="t1"), h("0003 0001 00000006 | 00000002 7431")),
    (Detached(topic="t1"), h("0004 0001 00000006 | 00000002 7431")),
    (Publish(topic="t1", seq_num=3, data=b"hi"),
     h("0005 0001 00000014 | 00000002 7431 | 0000000000000003 | 00000002 6869")),
    (Publish(topic="t1", seq_num=U64_MAX, data=b""),
     h("0005 0001 00000012 | 00000002 7431 | ffffffffffffffff | 00000000")),
    (Ack(seq_num=3), h("0006 0001 00000008 | 0000000000000003")),
    (Data(topic="t1", offset=7, data=b"hi"),
     h("0007 0001 00000014 | 00000002 7431 | 0000000000000007 | 00000002 6869")),
    (Data(topic="é", offset=1, data=b"\x00"),
     h("0007 0001 00000013 | 00000002 c3a9 | 0000000000000001 | 00000001 00")),
    (Ping(timestamp=0x0102030405060708), h("0008 0001 00000008 | 0102030405060708")),
    (Pong(timestamp=0x0102030405060708), h("0009 0001 00000008 | 0102030405060708")),
]
GOLDEN_IDS = [f"{type(m).__name__}-{i}" for i, (m, _) in enumerate(GOLDEN)]


def sender_role(message: Any) -> Role:
    return Role.CLIENT if TYPE_OF[type(message)] in REQUESTS else Role.SERVER


def receiver_role(message: Any) -> Role:
    return Role.SERVER if sender_role(message) is Role.CLIENT else Role.CLIENT


def drain(conn: FiggConnection) -> list[Any]:
    """Every event ``next_event`` gives until it needs data or the peer closed."""
    events = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if event is CLOSED:
            break
    return events


def feed_whole(role: Role, raw: bytes) -> list[Any]:
    conn = FiggConnection(role)
    conn.receive_data(raw)
    return drain(conn)


def feed_byte_by_byte(role: Role, raw: bytes) -> list[Any]:
    conn = FiggConnection(role)
    events = []
    for i in range(len(raw)):
        conn.receive_data(raw[i:i + 1])
        events += drain(conn)
    return events


def feed_with_trailing(role: Role, raw: bytes) -> list[Any]:
    """The frame followed by the first bytes of another: those must wait for more."""
    conn = FiggConnection(role)
    conn.receive_data(raw + raw[:11])
    events = drain(conn)
    assert conn.next_event() is NEED_DATA
    return events


FEEDS = [feed_whole, feed_byte_by_byte, feed_with_trailing]


@pytest.mark.parametrize(("message", "raw"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_encode(message: Any, raw: bytes) -> None:
    assert FiggConnection(sender_role(message)).send(message) == raw
    assert CODEC_BY_TYPE[TYPE_OF[type(message)]].encode(message, version=1) == raw[8:]


@pytest.mark.parametrize("feed", FEEDS)
@pytest.mark.parametrize(("message", "raw"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_decode(message: Any, raw: bytes, feed: Any) -> None:
    assert feed(receiver_role(message), raw) == [message]
    assert CODEC_BY_TYPE[TYPE_OF[type(message)]].decode(raw[8:], version=1) == message


def test_attach_flag_is_bit_15() -> None:
    assert ATTACH_FROM_OFFSET == 1 << 15


def test_records_are_named_after_the_messages() -> None:
    assert [TYPE_OF[r] for r in (Attach, Attached, Detach, Detached, Publish, Ack, Data,
                                 Ping, Pong)] == list(MessageType)
    requests = {MessageType.ATTACH, MessageType.DETACH, MessageType.PUBLISH, MessageType.PING}
    assert requests == REQUESTS


def test_many_frames_then_eof() -> None:
    raws = [raw for message, raw in GOLDEN if receiver_role(message) is Role.SERVER]
    conn = FiggConnection(Role.SERVER)
    conn.receive_data(b"".join(raws))
    conn.receive_data(b"")
    events = conn.next_events()
    assert events[-1] is CLOSED
    assert events[:-1] == [m for m, _ in GOLDEN if receiver_role(m) is Role.SERVER]
    assert conn.next_events() == [CLOSED]


def test_next_events_is_empty_when_it_needs_data() -> None:
    conn = FiggConnection(Role.CLIENT)
    assert conn.next_events() == []
    conn.receive_data(encode_ack(1)[:5])
    assert conn.next_events() == []
    conn.receive_data(encode_ack(1)[5:])
    assert conn.next_events() == [Ack(seq_num=1)]


def test_payloads_are_fresh_bytes() -> None:
    buffer = bytearray(encode_data(b"t", 5, b"payload"))
    conn = FiggConnection(Role.CLIENT)
    conn.receive_data(buffer)
    buffer[-7:] = b"XXXXXXX"  # the caller reuses its read buffer
    (event,) = conn.next_events()
    assert type(event.data) is bytes
    assert event.data == b"payload"


def test_fast_encoders_match_send() -> None:
    server = FiggConnection(Role.SERVER)
    items = [(1, b"a"), (2, b""), (U64_MAX, bytes(300))]
    expected = b"".join(server.send(Data(topic="t1", offset=o, data=d)) for o, d in items)
    assert encode_data_frames(b"t1", items) == expected
    assert encode_data_frames(b"t1", iter(items)) == expected
    assert b"".join(encode_data(b"t1", o, d) for o, d in items) == expected
    assert encode_data_frames(b"t1", []) == b""
    assert encode_ack(9) == server.send(Ack(seq_num=9))


# -- round trips ---------------------------------------------------------------------------

topics = st.text(max_size=40)
u64 = st.integers(min_value=0, max_value=U64_MAX)
payloads = st.binary(max_size=300)
MESSAGES = st.one_of(
    st.builds(Attach, flags=st.integers(0, 0xFFFF), topic=topics, offset=u64),
    st.builds(Attached, topic=topics, offset=u64),
    st.builds(Detach, topic=topics),
    st.builds(Detached, topic=topics),
    st.builds(Publish, topic=topics, seq_num=u64, data=payloads),
    st.builds(Ack, seq_num=u64),
    st.builds(Data, topic=topics, offset=u64, data=payloads),
    st.builds(Ping, timestamp=u64),
    st.builds(Pong, timestamp=u64),
)


@given(MESSAGES)
def test_round_trip(message: Any) -> None:
    raw = FiggConnection(sender_role(message)).send(message)
    codec = CODEC_BY_TYPE[TYPE_OF[type(message)]]
    assert raw[8:] == codec.encode(message, version=1)
    for feed in FEEDS:
        assert feed(receiver_role(message), raw) == [message]


@given(st.lists(MESSAGES, max_size=8), st.data())
def test_stream_split_anywhere(messages: list[Any], data: st.DataObject) -> None:
    for role in Role:
        sent = [m for m in messages if receiver_role(m) is role]
        raw = b"".join(FiggConnection(sender_role(m)).send(m) for m in sent)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=5)))
        conn = FiggConnection(role)
        events: list[Any] = []
        for start, end in zip([0, *cuts], [*cuts, len(raw)], strict=True):
            if end > start:  # b"" would mean EOF
                conn.receive_data(raw[start:end])
                events += conn.next_events()
        assert events == sent


@given(topics, st.lists(st.tuples(u64, payloads), max_size=10))
def test_data_frames_round_trip(topic: str, items: list[tuple[int, bytes]]) -> None:
    conn = FiggConnection(Role.CLIENT)
    conn.receive_data(encode_data_frames(topic.encode(), items) + encode_ack(0))
    assert conn.next_events()[:-1] == [Data(topic=topic, offset=o, data=d) for o, d in items]


# -- bad input -----------------------------------------------------------------------------

def frame(message_type: int, payload: bytes, version: int = 1) -> bytes:
    return message_type.to_bytes(2, "big") + version.to_bytes(2, "big") + \
        len(payload).to_bytes(4, "big") + payload


T1 = h("00000002 7431")  # topic "t1"
BAD: list[tuple[str, Role, bytes]] = [
    ("unknown type 0", Role.SERVER, frame(0, b"")),
    ("unknown type 10", Role.CLIENT, frame(10, b"")),
    ("unknown type ffff", Role.SERVER, frame(0xFFFF, T1)),
    ("unknown type, version 2", Role.SERVER, frame(0, b"", version=2)),
    *[(f"server gets {t.name}", Role.SERVER, FAST[t].encode_record(m))
      for m, _ in GOLDEN if (t := TYPE_OF[type(m)]) not in REQUESTS],
    *[(f"client gets {t.name}", Role.CLIENT, FAST[t].encode_record(m))
      for m, _ in GOLDEN if (t := TYPE_OF[type(m)]) in REQUESTS],
    *[(f"empty {t.name}", Role.SERVER if t in REQUESTS else Role.CLIENT, frame(t, b""))
      for t in MessageType],
    ("short ATTACH", Role.SERVER, frame(1, h("8000 0000"))),
    ("ATTACH without offset", Role.SERVER, frame(1, h("8000") + T1)),
    ("ATTACH offset cut", Role.SERVER, frame(1, h("8000") + T1 + bytes(7))),
    ("ATTACH topic past payload", Role.SERVER, frame(1, h("8000 00000009 7431") + bytes(8))),
    ("ATTACH topic length huge", Role.SERVER, frame(1, h("8000 ffffffff 7431") + bytes(8))),
    ("ATTACH trailing byte", Role.SERVER, frame(1, h("8000") + T1 + bytes(9))),
    ("DETACH topic short", Role.SERVER, frame(3, h("00000003 7431"))),
    ("DETACH trailing", Role.SERVER, frame(3, T1 + b"x")),
    ("PUBLISH data overruns", Role.SERVER, frame(5, T1 + bytes(8) + h("00000005 6869"))),
    ("PUBLISH data short", Role.SERVER, frame(5, T1 + bytes(8) + h("00000001 6869"))),
    ("PUBLISH without data length", Role.SERVER, frame(5, T1 + bytes(8))),
    ("PUBLISH topic past payload", Role.SERVER, frame(5, h("00000100 7431") + bytes(12))),
    ("PUBLISH topic not UTF-8", Role.SERVER, frame(5, h("00000002 ff fe") + bytes(12))),
    ("ATTACH topic not UTF-8", Role.SERVER, frame(1, h("8000 00000001 80") + bytes(8))),
    ("PING short", Role.SERVER, frame(8, bytes(7))),
    ("PING long", Role.SERVER, frame(8, bytes(9))),
    ("ACK short", Role.CLIENT, frame(6, bytes(4))),
    ("DATA data overruns", Role.CLIENT, frame(7, T1 + bytes(8) + h("00000003 6869"))),
    ("DATA trailing", Role.CLIENT, frame(7, T1 + bytes(8) + h("00000001 6869"))),
    ("DATA topic not UTF-8", Role.CLIENT, frame(7, h("00000001 c3") + bytes(12))),
    ("ATTACHED offset cut", Role.CLIENT, frame(2, T1 + bytes(4))),
]


@pytest.mark.parametrize(("role", "raw"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_protocol_error(role: Role, raw: bytes) -> None:
    for feed in FEEDS:
        with pytest.raises(ProtocolError):
            feed(role, raw)
    # The engine codec agrees wherever the frame's type and version are right for the role.
    message_type, version = int.from_bytes(raw[:2], "big"), int.from_bytes(raw[2:4], "big")
    inbound = REQUESTS if role is Role.SERVER else set(MessageType) - REQUESTS
    if message_type in inbound and version == 1:
        with pytest.raises(ProtocolError):
            CODEC_BY_TYPE[MessageType(message_type)].decode(raw[8:], version=1)


@pytest.mark.parametrize("version", [0, 2, 0xFFFF])
@pytest.mark.parametrize(("message", "raw"), GOLDEN, ids=GOLDEN_IDS)
def test_any_header_version_is_decoded_by_type(message: Any, raw: bytes, version: int) -> None:
    # The real Figg server ignores the header's version field; so does figtank, both ways
    # (the fast PUBLISH scan of the server included).
    other = raw[:2] + version.to_bytes(2, "big") + raw[4:]
    for feed in FEEDS:
        assert feed(receiver_role(message), other) == [message]
    if receiver_role(message) is Role.SERVER:
        conn = FiggConnection(Role.SERVER)
        conn.receive_data(other)
        [event] = conn.next_batch(5)
        assert event == message or (event.count == 1 and event.topic == message.topic)


def test_error_is_sticky_and_earlier_events_survive() -> None:
    good = encode_ack(1)
    conn = FiggConnection(Role.CLIENT)
    conn.receive_data(good + frame(6, bytes(7)) + good)
    assert conn.next_events() == [Ack(seq_num=1)]
    with pytest.raises(ProtocolError, match="truncated"):
        conn.next_events()
    with pytest.raises(ProtocolError):
        conn.next_event()


def test_eof_inside_a_frame() -> None:
    conn = FiggConnection(Role.SERVER)
    conn.receive_data(frame(8, bytes(8))[:-1])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(ProtocolError, match="closed in the middle"):
        conn.next_event()


def test_frame_too_large_as_soon_as_the_header_is_in() -> None:
    conn = FiggConnection(Role.SERVER, max_frame_size=100)
    assert conn.max_frame_size == 100
    conn.receive_data(h("0005 0001 00000065"))  # 101: nothing of the payload yet
    with pytest.raises(FrameTooLarge):
        conn.next_event()
    ok = FiggConnection(Role.SERVER, max_frame_size=100)
    publish = Publish(topic="t", seq_num=1, data=bytes(100 - 17))
    ok.receive_data(FiggConnection(Role.CLIENT).send(publish))
    assert ok.next_events() == [publish]


def test_default_frame_limit_refuses_a_4_gib_header() -> None:
    conn = FiggConnection(Role.SERVER)
    conn.receive_data(h("0005 0001 ffffffff"))
    with pytest.raises(FrameTooLarge):
        conn.next_events()


def test_send_refuses_what_the_role_does_not_send() -> None:
    with pytest.raises(ValueError, match="server does not send Attach"):
        FiggConnection(Role.SERVER).send(Attach(flags=0, topic="t", offset=0))
    with pytest.raises(ValueError, match="client does not send Data"):
        FiggConnection(Role.CLIENT).send(Data(topic="t", offset=0, data=b""))
    with pytest.raises(TypeError):
        FiggConnection(Role.CLIENT).send(object())


def test_send_refuses_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError):
        FiggConnection(Role.SERVER).send(Ack(seq_num=2**64))
    with pytest.raises(ValueError):
        FiggConnection(Role.CLIENT).send(Attach(flags=0x10000, topic="t", offset=0))
    with pytest.raises(ValueError):
        encode_data(b"t", -1, b"")
    with pytest.raises(ValueError):
        encode_data_frames(b"t", [(2**64, b"")])
