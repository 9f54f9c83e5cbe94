"""An access policy with bearer tokens for the HTTP tests, and an SSE stream read with h11."""

from __future__ import annotations

from tests.http.helpers import H11Client

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


async def produce(client: H11Client, topic: str, value: str) -> None:
    status, _, body = await client.request("POST", f"/topics/{topic}", value.encode(),
                                           [("authorization", f"Bearer {WRITER}")])
    assert status == 200, body
