"""The metrics and health endpoint over real sockets: raw HTTP/1.1 requests to the server
that ``figtank serve`` runs (over the in-memory backend), its limits included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from gateway.core.config import Settings
from gateway.server.run import open_server
from tests.figg.memory_backend import MemoryBackend


@asynccontextmanager
async def endpoint(**settings: Any) -> AsyncIterator[tuple[str, int]]:
    """Only the HTTP endpoint, on 127.0.0.1 (an ephemeral port); where it listens."""
    config = Settings(figg_listen="", tank_listen="", metrics_listen="127.0.0.1:0",
                      kafka_listen="", http_listen="", **settings)
    async with open_server(config, backend=MemoryBackend(), grace=0) as server:
        assert server.metrics is not None
        yield server.metrics


class Peer:
    """One HTTP connection: raw requests out, responses parsed by hand."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    @classmethod
    async def connect(cls, address: tuple[str, int]) -> Peer:
        return cls(await trio.open_tcp_stream(*address))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError(f"closed by the server; unread: {self.buffer!r}")
        self.buffer += data

    async def response(self, *, head: bool = False
                       ) -> tuple[int, dict[str, str], bytes]:
        """The next response: status, headers (lower-case names) and body."""
        while b"\r\n\r\n" not in self.buffer:
            await self._fill()
        top, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = top.decode("latin-1").split("\r\n")
        version, status, _ = status_line.split(" ", 2)
        assert version == "HTTP/1.1"
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if head else int(headers["content-length"])
        while len(self.buffer) < length:
            await self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status), headers, body

    async def closed(self) -> bool:
        """True when the server closes the connection (with nothing more to read)."""
        try:
            return not self.buffer and not await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            return True


def get(path: str, method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: test\r\n{extra}\r\n".encode()


async def test_keep_alive_serves_two_requests_on_one_connection() -> None:
    with trio.fail_after(10):
        async with endpoint() as address:
            peer = await Peer.connect(address)
            await peer.send(get("/health"))
            assert await peer.response() == (
                200, {"content-type": "text/plain; charset=utf-8", "content-length": "6"},
                b"ready\n")
            await peer.send(get("/metrics"))
            status, headers, body = await peer.response()
            assert status == 200
            assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert b"figtank_connections_accepted_total" in body
            # Pipelined: both answered, in order.
            await peer.send(get("/health/live") + get("/health"))
            assert (await peer.response())[2] == b"live\n"
            assert (await peer.response())[2] == b"ready\n"


async def test_head_gives_the_headers_of_get_without_a_body() -> None:
    with trio.fail_after(10):
        async with endpoint() as address:
            peer = await Peer.connect(address)
            await peer.send(get("/health", "HEAD"))
            status, headers, body = await peer.response(head=True)
            assert (status, headers["content-length"], body) == (200, "6", b"")
            # Nothing followed the headers: the next answer is the next request's.
            await peer.send(get("/health/live"))
            assert (await peer.response())[::2] == (200, b"live\n")


async def test_query_string_unknown_path_and_other_methods() -> None:
    with trio.fail_after(10):
        async with endpoint() as address:
            peer = await Peer.connect(address)
            await peer.send(get("/metrics?x=1"))
            status, _, body = await peer.response()
            assert status == 200 and b"figtank_requests" in body
            await peer.send(get("/health?verbose"))
            assert (await peer.response())[::2] == (200, b"ready\n")
            await peer.send(get("/nowhere"))
            assert (await peer.response())[::2] == (404, b"not found\n")
            await peer.send(get("/metrics", "POST", "Content-Length: 3\r\n") + b"abc")
            status, headers, _ = await peer.response()
            assert (status, headers["allow"]) == (405, "GET, HEAD")
            await peer.send(get("/health"))  # the connection is still good
            assert (await peer.response())[0] == 200


async def test_lines_ending_in_a_bare_lf_are_answered_at_once() -> None:
    # Issue 15, item 8: such a request used to wait for the timeout. The timeout here is
    # longer than the test may take.
    with trio.fail_after(10):
        async with endpoint(http_timeout_secs=30) as address:
            peer = await Peer.connect(address)
            await peer.send(b"GET /health HTTP/1.1\nHost: test\n\n"
                            b"GET /metrics?x=1 HTTP/1.1\r\nHost: test\n\n")
            assert (await peer.response())[::2] == (200, b"ready\n")
            status, _, body = await peer.response()
            assert status == 200 and b"figtank_requests" in body
            # HTTP/1.0 with bare LFs: answered, then closed.
            peer = await Peer.connect(address)
            await peer.send(b"GET /health/live HTTP/1.0\n\n")
            assert (await peer.response())[::2] == (200, b"live\n")
            assert await peer.closed()


async def test_bad_request_gets_400_and_the_connection_closes() -> None:
    with trio.fail_after(10):
        async with endpoint() as address:
            for garbage in (b"GARBAGE\r\n\r\n", b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
                            b"GET /metrics HTTP/1.1\r\n\r\n"):  # HTTP/1.1 without Host
                peer = await Peer.connect(address)
                await peer.send(garbage)
                status, headers, _ = await peer.response()
                assert (status, headers["connection"]) == (400, "close")
                assert await peer.closed()
            # A head over 8 KiB: refused, closed.
            peer = await Peer.connect(address)
            await peer.send(get("/metrics", extra="X-Big: " + "x" * 9000 + "\r\n"))
            assert (await peer.response())[0] == 431
            assert await peer.closed()


async def test_connections_are_bounded_and_slow_ones_time_out() -> None:
    with trio.fail_after(10):
        async with endpoint(http_max_connections=2, http_timeout_secs=0.5) as address:
            first, second = await Peer.connect(address), await Peer.connect(address)
            await first.send(get("/health"))
            assert (await first.response())[0] == 200
            await second.send(b"GET /health HTTP/1.1\r\n")  # half a request
            await trio.sleep(0.1)
            third = await Peer.connect(address)
            assert await third.closed()  # over the limit: closed on accept
            began = trio.current_time()
            assert await first.closed()  # idle, kept alive: closed after the timeout
            assert await second.closed()  # too slow to send its request
            assert 0.2 < trio.current_time() - began < 2
            fourth = await Peer.connect(address)  # the slots are free again
            await fourth.send(get("/health/live"))
            assert (await fourth.response())[0] == 200
            await fourth.send(get("/metrics"))
            assert b'\nfigtank_limit_hits_total{limit="http_max_connections"} 1.0\n' in (
                await fourth.response())[2]
