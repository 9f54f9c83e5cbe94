"""Every close the server starts reaches the client: its close frame (code and reason)
comes before the TCP close, right after the handshake included, and even when the client
sent more after the offending frame. Checked with hand-made frames on a raw socket (the
upgrade and the frames in one write: nothing read before the server's hello), with the
``websockets`` library (its sync client, in a thread), and in Chromium (a page's onopen
sends a bad message; the CloseEvent's code, asserted here)."""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from websockets.sync.client import connect

from tests.http.browser import chromium, free_port
from tests.http.helpers import http_server
from tests.http.ws_client import websockets_close
from tests.serving import figtank_serve

UPGRADE = (b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\n\r\n")
TEXT, BINARY, CLOSE, PING = 0x1, 0x2, 0x8, 0x9


def frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0,
          masked: bool = True) -> bytes:
    """One client frame as the bytes say, right or wrong."""
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    size = len(payload)
    mask_bit = 0x80 if masked else 0
    if size < 126:
        head += bytes([mask_bit | size])
    elif size < 65536:
        head += bytes([mask_bit | 126]) + struct.pack("!H", size)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", size)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def text(value: Any) -> bytes:
    return frame(TEXT, json.dumps(value).encode() if not isinstance(value, bytes) else value)


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """``(opcode, payload)`` of each whole server frame (unmasked) in ``data``."""
    out = []
    i = 0
    while i + 2 <= len(data):
        opcode, size = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if size == 126:
            size, i = struct.unpack("!H", data[i:i + 2])[0], i + 2
        elif size == 127:
            size, i = struct.unpack("!Q", data[i:i + 8])[0], i + 8
        if i + size > len(data):
            break
        out.append((opcode, data[i:i + size]))
        i += size
    return out


async def raw_exchange(host: str, port: int, *frames: bytes, junk: int = 0
                       ) -> tuple[list[Any], tuple[int, str] | None, bool]:
    """Send the upgrade and ``frames`` in one write (then ``junk`` more bytes of a frame the
    server never sees the end of); read until the server closes the TCP connection. The
    JSON messages, the close frame's (code, reason), and whether the TCP close came."""
    stream = await trio.open_tcp_stream(host, port)
    try:
        await stream.send_all(UPGRADE + b"".join(frames))
        if junk:
            # A frame announcing more than it sends: the server is still reading it when
            # it closes (unread bytes at close would reset the connection).
            await stream.send_all(frame(TEXT, b"x" * junk)[:junk])
        received = b""
        with trio.fail_after(5):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                received += data
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        messages: list[Any] = []
        closed = None
        for opcode, payload in server_frames(body):
            if opcode == TEXT:
                messages.append(json.loads(payload))
            elif opcode == CLOSE:
                closed = (struct.unpack("!H", payload[:2])[0], payload[2:].decode())
        return messages, closed, True
    finally:
        await stream.aclose()


@pytest.fixture
async def server(tmp_path: Path) -> Any:
    async with http_server(tmp_path, http_max_body_bytes=4096, http_ws_publish_window=8
                           ) as running:
        yield running


#: (first frames after the upgrade, the close code, words of its reason)
PROTOCOL_CASES = [
    ((frame(0x3, b"x"),), 1002, "opcode"),                         # a reserved opcode
    ((frame(0xB, b""),), 1002, "opcode"),                          # a reserved control one
    ((frame(TEXT, b'{"op":"ping"}', masked=False),), 1002, "unmasked"),
    ((frame(TEXT, b'{"op":"ping"}', rsv=0b100),), 1002, "reserved bit"),
    ((frame(PING, b"p", fin=False),), 1002, "fragment"),           # a fragmented control
    ((frame(0x0, b"more"),), 1002, "continuation"),                # nothing to continue
    ((frame(TEXT, b"\xff\xfe not utf-8"),), 1007, "utf-8"),
    ((frame(TEXT, b"{not json"),), 1007, "not json"),
    ((text([1, 2]),), 1007, "json object"),
    ((frame(BINARY, b"\x00\x01"),), 1003, "binary"),
    ((text({"op": "teleport"}),), 1008, "unknown op"),
    ((text({"op": "attach", "topic": "../etc"}),), 1008, "invalid topic"),
    ((text({"op": "publish", "topic": "t"}),), 1008, "needs a value"),
    ((frame(TEXT, b"x" * 5000),), 1009, "over 4096"),
    (tuple(text({"op": "publish", "topic": "w", "value": "v", "id": i}) for i in range(20)),
     1008, "unacknowledged"),
]


@pytest.mark.parametrize(("frames", "code", "words"), PROTOCOL_CASES)
async def test_a_close_right_after_the_handshake_is_sent(server: Any, frames: tuple,
                                                          code: int, words: str) -> None:
    with trio.fail_after(10):
        messages, closed, tcp_closed = await raw_exchange(server.host, server.port, *frames)
    assert messages[:1] == [{"op": "hello", "publish_window": 8}]
    assert closed is not None, "no close frame"
    assert closed[0] == code, closed
    assert words in closed[1].lower(), closed
    assert tcp_closed


async def test_the_close_frame_arrives_though_the_client_sent_more(server: Any) -> None:
    """A bad message followed by good ones and then a large unfinished frame: the close
    still arrives (no reset destroys it), and nothing after the bad message is served."""
    with trio.fail_after(10):
        messages, closed, tcp_closed = await raw_exchange(
            server.host, server.port, frame(TEXT, b"{not json"),
            text({"op": "ping", "ts": 1}), junk=200_000)
    assert closed is not None and closed[0] == 1007
    assert [m["op"] for m in messages] == ["hello"]
    assert tcp_closed


async def test_messages_before_the_hello_are_answered_in_order_after_it(server: Any
                                                                         ) -> None:
    """A client may send right after its upgrade, before it read the 101: the server
    answers after its hello, in order, acks included."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(server.host, server.port)
        await stream.send_all(UPGRADE + text({"op": "ping", "ts": 1})
                              + text({"op": "publish", "topic": "early", "value": "a",
                                      "id": "a"})
                              + text({"op": "ping", "ts": 2}))
        received = b""
        while len(server_frames(received.partition(b"\r\n\r\n")[2])) < 4:
            received += await stream.receive_some(65536)
        await stream.send_all(frame(CLOSE, struct.pack("!H", 1000) + b"bye"))
        while data := await stream.receive_some(65536):
            received += data
        await stream.aclose()
    _, _, body = received.partition(b"\r\n\r\n")
    frames = server_frames(body)
    got = [json.loads(p) if o == TEXT else o for o, p in frames]
    assert got[:2] == [{"op": "hello", "publish_window": 8}, {"op": "pong", "ts": 1}]
    # An ack is urgent: it may pass the second pong, never the hello.
    assert sorted(m["op"] for m in got[2:4]) == ["ack", "pong"]
    assert got[4:] == [CLOSE]  # the answer to the client's close, then the TCP close
    assert struct.unpack("!H", frames[-1][1][:2])[0] == 1000


async def test_close_codes_with_the_websockets_library(server: Any) -> None:
    url = f"ws://{server.host}:{server.port}/ws"
    cases: list[tuple[tuple[str | bytes, ...], int]] = [
        (("{not json",), 1007),
        ((b"\x00binary",), 1003),
        (('{"op": "detach", "topic": "t", "partition": -1}',), 1008),
        (("x" * 5000,), 1009),
        (('{"op": "ping", "ts": 7}', '{"op": "nope"}'), 1008),
    ]
    with trio.fail_after(30):
        for sent, code in cases:
            got_code, reason, got = await trio.to_thread.run_sync(websockets_close, url,
                                                                  *sent)
            assert got_code == code, (sent, got_code, reason)
            assert reason
            assert got[0]["op"] == "hello"
        # A clean close from the client is answered with the same code.
        def normal() -> tuple[int, str]:
            with connect(url) as socket_:
                socket_.recv(timeout=5)
                socket_.close(1000, "done")
                received = socket_.protocol.close_rcvd
                assert received is not None
                return received.code, received.reason
        assert (await trio.to_thread.run_sync(normal))[0] == 1000


@contextmanager
def _served(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--durability", "os",
                       "--tank-listen", "", "--figg-listen", "", "--metrics-listen", "",
                       "--http-listen", f"127.0.0.1:{port}"):
        yield f"http://127.0.0.1:{port}"


PROBE = """
const done = arguments[arguments.length - 1];
const socket = new WebSocket("ws://" + location.host + "/ws");
socket.onopen = () => socket.send(arguments[0]);
socket.onclose = (e) => done([e.code, e.reason, e.wasClean]);
"""


def test_a_browser_sees_the_close_code_of_its_first_message(tmp_path: Path) -> None:
    """A page's onopen sends a bad message at once (before the hello arrives): Chromium's
    CloseEvent carries the server's code and reason, and the close was clean."""
    with _served(tmp_path) as base, chromium(tmp_path / "profile") as page:
        page.set_script_timeout(10)
        page.get(f"{base}/")
        started = time.monotonic()
        for sent, code, words in (('{"op": "teleport"}', 1008, "unknown op"),
                                  ("{not json", 1007, "not json"),
                                  ('{"op": "attach", "topic": "../x"}', 1008, "topic")):
            got_code, reason, clean = page.execute_async_script(PROBE, sent)
            assert (got_code, clean) == (code, True), (sent, got_code, reason, clean)
            assert words in reason.lower()
        assert time.monotonic() - started < 10

