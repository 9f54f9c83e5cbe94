"""A stream admitted with a JWT ends when the token expires: an SSE stream (read with h11)
after an ``event: expired``, a WebSocket (the ``websockets`` library) with close 4001;
a stream of a static token, or of a JWT without ``exp``, goes on."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import jwt
import trio
from structlog.testing import capture_logs
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.http.access_helpers import READER, policy, produce
from tests.http.helpers import H11Client, SseReader, http_server, sse_events
from tests.http.test_ws_closes import CLOSE, UPGRADE, server_frames

SECRET = "a-shared-secret-for-the-expiry-tests-0123"
#: Seconds the short-lived token lives (time enough to open the streams).
LIFETIME = 1.5


def _websocket_until_closed(port: int, token: str) -> tuple[list[str], int, str, float]:
    """In a thread: a ``websockets`` client attaches to "news" and reads until the server
    closes; the values it got, the close code and reason, and when it closed."""
    values = []
    with connect(f"ws://127.0.0.1:{port}/ws", additional_headers={
            "Authorization": f"Bearer {token}"}, open_timeout=5) as socket:
        assert json.loads(socket.recv(timeout=5))["op"] == "hello"
        socket.send(json.dumps({"op": "attach", "topic": "news", "from": "earliest"}))
        try:
            while True:
                message = json.loads(socket.recv(timeout=LIFETIME + 5))
                if message["op"] == "data":
                    values.append(message["value"])
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return values, closed.rcvd.code, closed.rcvd.reason, time.time()


async def test_streams_end_when_their_jwt_expires(tmp_path: Path) -> None:
    access = tmp_path / "access.toml"
    access.write_text(policy('["news"]'))
    secret = tmp_path / "hs256.key"
    secret.write_text(SECRET)
    expires = time.time() + LIFETIME
    short = jwt.encode({"sub": "jwt-alice", "exp": expires}, SECRET, algorithm="HS256")
    forever = jwt.encode({"sub": "jwt-alice"}, SECRET, algorithm="HS256")
    with capture_logs() as logs, trio.fail_after(15):
        async with http_server(tmp_path, policy_file=access,
                               http_jwt_hs256_secret_file=str(secret)) as server:
            host, port = server.host, server.port
            writer = await H11Client.connect(host, port)
            await produce(writer, "news", "n1")
            sse = await SseReader.open(host, port, "/topics/news/events?from=earliest"
                                       f"&access_token={short}")
            static = await SseReader.open(host, port, "/topics/news/events?from=earliest"
                                          f"&access_token={READER}")
            unlimited = await SseReader.open(host, port, "/topics/news/events?from=earliest"
                                             f"&access_token={forever}")
            ws_result: list[tuple[list[str], int, str, float]] = []

            async def websocket() -> None:
                ws_result.append(await trio.to_thread.run_sync(
                    _websocket_until_closed, port, short))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(websocket)
                await sse.read_until(lambda s: s.ended, timeout=LIFETIME + 5)
                sse_ended = time.time()
            assert expires <= sse_ended < expires + 1
            *values, last = sse_events(sse.text)
            assert [json.loads(v["data"])["value"] for v in values] == ["n1"]
            assert last["event"] == "expired"
            assert json.loads(last["data"]) == {"error": "token_expired",
                                                "message": "token expired"}
            [(ws_values, code, reason, ws_closed)] = ws_result
            assert ws_values == ["n1"]
            assert (code, reason) == (4001, "token expired")
            assert expires <= ws_closed < expires + 1

            # The streams whose tokens do not expire go on.
            await produce(writer, "news", "n2")
            for stream in (static, unlimited):
                await stream.read_until(lambda s: len(s.values()) == 2)
                assert stream.values() == ["n1", "n2"] and not stream.ended
            # The expired token is refused from now on.
            status, _, body = await writer.request(
                "GET", f"/topics/news/events?access_token={short}")
            assert status == 401 and body["error"] == "invalid_token"
            for client in (sse.client, static.client, unlimited.client, writer):
                await client.aclose()
    expired = sorted(e["stream"] for e in logs if e["event"] == "http_stream_expired")
    assert expired == ["sse", "websocket"]


async def test_the_expiry_close_is_drained_like_every_other_close(tmp_path: Path) -> None:
    """A WebSocket closed because its token expired ends as the other closes the server
    starts: its side closed first (FIN) and what the client still sends drained, so that
    no reset destroys the 4001 close frame before the client reads it."""
    secret = tmp_path / "hs256.key"
    secret.write_text(SECRET)
    access = tmp_path / "access.toml"
    access.write_text(policy('["news"]'))
    async with http_server(tmp_path, policy_file=access,
                           http_jwt_hs256_secret_file=str(secret)) as server:
        # Made once the server is up: on a busy machine its start can take the token's
        # whole second, and an expired token is refused at the upgrade, with no close.
        token = jwt.encode({"sub": "jwt-alice", "exp": time.time() + 1}, SECRET,
                           algorithm="HS256")
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(server.host, server.port)
            await stream.send_all(UPGRADE.replace(
                b"GET /ws ", b"GET /ws?access_token=" + token.encode() + b" "))
            received = b""
            while data := await stream.receive_some(65536):
                received += data
            # The server's side is closed: it still takes what the client sends (a
            # forceful close would answer each of these with a reset).
            for _ in range(4):
                await stream.send_all(b"after the close")
                await trio.sleep(0.05)
            await stream.aclose()
    body = received.partition(b"\r\n\r\n")[2]
    closes = [payload for opcode, payload in server_frames(body) if opcode == CLOSE]
    assert [struct.unpack("!H", c[:2])[0] for c in closes] == [4001], closes
