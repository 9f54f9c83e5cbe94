"""The HTTP listener in-process over the embedded store, and a raw h11 client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import h11
import trio

from gateway.core.config import Settings
from tests.listeners import RunningServer, listening


def http_settings(tmp_path: Path, **settings: Any) -> Settings:
    return Settings(data_dir=tmp_path / "data", durability="os", **settings)


@asynccontextmanager
async def http_server(tmp_path: Path, **settings: Any) -> AsyncIterator[RunningServer]:
    """Only the HTTP listener (an ephemeral loopback port) over a store in ``tmp_path``."""
    async with listening("http", None, http_settings(tmp_path, **settings)) as server:
        yield server


@asynccontextmanager
async def with_figg(tmp_path: Path, **settings: Any) -> AsyncIterator[Any]:
    """The HTTP and Figg listeners together; yields the server info."""
    from gateway.server.run import open_server

    config = replace(http_settings(tmp_path, **settings), figg_listen="127.0.0.1:0",
                     tank_listen="127.0.0.1:0", kafka_listen="", metrics_listen="",
                     http_listen="127.0.0.1:0")
    async with open_server(config, grace=0.2) as info:
        yield info


class H11Client:
    """One HTTP/1.1 connection driven by h11: requests out, responses (or a stream) in."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, host: str, port: int) -> H11Client:
        return cls(await trio.open_tcp_stream(host, port))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send(self, method: str, target: str, body: bytes = b"",
                   headers: list[tuple[str, str]] | None = None) -> None:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        all_headers = [("host", "localhost"), *(headers or [])]
        if body or method == "POST":
            all_headers.append(("content-length", str(len(body))))
        data = self.conn.send(h11.Request(method=method, target=target, headers=all_headers))
        if body:
            data += self.conn.send(h11.Data(data=body))
        data += self.conn.send(h11.EndOfMessage())
        await self.stream.send_all(data)

    async def next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            return event

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next whole response: status, headers, body."""
        head = await self.next_event()
        assert isinstance(head, h11.Response), head
        body = b""
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(event)
        return head.status_code, {k.decode(): v.decode() for k, v in head.headers}, body

    async def request(self, method: str, target: str, body: bytes = b"",
                      headers: list[tuple[str, str]] | None = None
                      ) -> tuple[int, dict[str, str], Any]:
        await self.send(method, target, body, headers)
        status, got_headers, raw = await self.response()
        kind = got_headers.get("content-type", "")
        return status, got_headers, json.loads(raw) if kind.startswith(
            "application/json") else raw


def sse_events(text: str) -> list[dict[str, str]]:
    """The events of an SSE body (fields of each; comments dropped), the complete ones
    only: an event counts once the blank line after it came, as in EventSource."""
    events = []
    for block in text.split("\n\n")[:-1]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            events.append(fields)
    return events



class SseReader:
    """One SSE stream read with h11: its text so far, whether it ended, and its events
    taken one by one (:meth:`next`)."""

    def __init__(self, client: H11Client) -> None:
        self.client = client
        self.text = ""
        self.ended = False
        self.taken = 0

    @classmethod
    async def open(cls, host: str, port: int, target: str) -> SseReader:
        client = await H11Client.connect(host, port)
        await client.send("GET", target)
        head = await client.next_event()
        assert isinstance(head, h11.Response) and head.status_code == 200, head
        return cls(client)

    async def read_until(self, predicate: Callable[[SseReader], bool], timeout: float = 10
                         ) -> None:
        with trio.fail_after(timeout):
            while not predicate(self):
                event = await self.client.next_event()
                if isinstance(event, h11.Data):
                    self.text += event.data.decode()
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    self.ended = True
                    return

    def values(self) -> list[str]:
        return [json.loads(e["data"])["value"] for e in sse_events(self.text)
                if "event" not in e]

    async def next(self, timeout: float = 15) -> dict[str, str]:
        """The next event not taken yet (waiting for it)."""
        await self.read_until(lambda r: len(sse_events(r.text)) > r.taken, timeout)
        events = sse_events(self.text)
        assert len(events) > self.taken, "the stream ended"
        self.taken += 1
        return events[self.taken - 1]


@dataclass
class Curl:
    """One curl run: its exit status, the answer's status, headers and body."""

    exit: int
    status: int
    headers: dict[str, str]
    body: str
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body)


async def curl_i(url: str, *args: str) -> Curl:
    """``curl -sS -i URL ARGS`` as a real subprocess."""
    started = trio.current_time()
    done = await trio.run_process(["curl", "-sS", "-i", "--max-time", "20", *args, url],
                                  capture_stdout=True, capture_stderr=True, check=False)
    seconds = trio.current_time() - started
    text = done.stdout.decode()
    head, _, body = text.partition("\r\n\r\n")
    lines = head.split("\r\n")
    status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Curl(done.returncode, status, headers, body, seconds)
