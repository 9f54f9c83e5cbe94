"""Slow requests (slowloris): a head or a body that does not arrive whole within
``limits.frame_timeout_secs`` is answered 408 with the JSON error, one log line and the
close, whether it stalls or trickles in a byte at a time; the listener serves others
meanwhile, and nothing of the late request is appended."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from structlog.testing import capture_logs

from tests.http.helpers import H11Client, http_server

HEAD = b"POST /topics/late HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"


async def _answer_then_close(stream: trio.SocketStream, trickle: bytes = b"") -> bytes:
    """What the server sends until it closes; ``trickle`` is sent a byte at a time meanwhile."""
    got = b""
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            async def drip() -> None:
                for byte in trickle:
                    try:
                        await stream.send_all(bytes([byte]))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    await trio.sleep(0.05)
            nursery.start_soon(drip)
            while chunk := await stream.receive_some(65536):
                got += chunk
            nursery.cancel_scope.cancel()
    return got


async def test_a_late_head_or_body_is_408_and_closed_while_others_are_served(tmp_path: Path
                                                                            ) -> None:
    async with http_server(tmp_path, frame_timeout_secs=0.4, idle_timeout_secs=30) as server:
        cases = [(b"POST /topics/late HTTP/1.1\r\nHo", b""),  # the head stalls
                 (HEAD + b"\r\n01234", b""),  # the body stalls
                 (b"P", b"OST /topics/late HTTP/1.1\r\nHost: x\r\n" * 3)]  # it trickles
        for sent, trickle in cases:
            stream = await trio.open_tcp_stream(server.host, server.port)
            await stream.send_all(sent)
            start = trio.current_time()
            with capture_logs() as logs:
                other = await H11Client.connect(server.host, server.port)
                status, _, _ = await other.request("GET", "/topics")  # served meanwhile
                assert status == 200
                await other.aclose()
                answer = await _answer_then_close(stream, trickle)
            assert trio.current_time() - start >= 0.35
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), answer
            assert b"connection: close" in head.lower()
            assert json.loads(body)["error"] == "request_timeout"
            refused = [e for e in logs if e["event"] == "http_request_refused"]
            assert [e["error"] for e in refused] == ["request_timeout"], logs
            await stream.aclose()
        client = await H11Client.connect(server.host, server.port)
        status, _, body = await client.request("GET", "/topics/late")
        assert status == 404, body  # nothing of the late requests was appended
        await client.aclose()
