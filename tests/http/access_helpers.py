"""An access policy with bearer tokens for the HTTP tests, and an SSE stream read with h11."""

from __future__ import annotations

import json
from collections.abc import Callable

import h11
import trio

from tests.http.helpers import H11Client, sse_events

READER = "reader-token-0123456789"
OTHER = "other-token-0123456789a"
WRITER = "writer-token-0123456789"


def policy(reader_topics: str, *, reader_token: bool = True) -> str:
    tokens = f'[[token]]\nuser = "writer"\ntoken = "{WRITER}"\n'
    tokens += f'[[token]]\nuser = "other"\ntoken = "{OTHER}"\n'
    if reader_token:
        tokens += f'[[token]]\nuser = "reader"\ntoken = "{READER}"\n'
    return f"""default = "deny"
{tokens}
[[rule]]
who = ["user:writer"]
topics = "*"
allow = ["publish", "create", "subscribe"]
[[rule]]
who = ["user:reader"]
topics = {reader_topics}
allow = ["subscribe"]
[[rule]]
who = ["user:other", "user:jwt-alice"]
topics = "*"
allow = ["subscribe"]
"""


class SseReader:
    """One SSE stream read with h11: its text so far, and whether it ended."""

    def __init__(self, client: H11Client) -> None:
        self.client = client
        self.text = ""
        self.ended = False

    @classmethod
    async def open(cls, host: str, port: int, target: str) -> SseReader:
        client = await H11Client.connect(host, port)
        await client.send("GET", target)
        head = await client.next_event()
        assert head.status_code == 200, head
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


async def produce(client: H11Client, topic: str, value: str) -> None:
    status, _, body = await client.request("POST", f"/topics/{topic}", value.encode(),
                                           [("authorization", f"Bearer {WRITER}")])
    assert status == 200, body
