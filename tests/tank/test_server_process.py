"""Against a listener in its own process, as clients meet it in production."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from gateway.client.tank import Message, open_tank_client
from tests.serving import figtank_serve


@pytest.fixture
def server_port(tmp_path: Path) -> Iterator[int]:
    with figtank_serve("--data-dir", str(tmp_path), "--durability", "os",
                       "--tank-listen", "127.0.0.1:0", "--figg-listen", "",
                       "--metrics-listen", "") as server:
        assert server.tank is not None
        yield server.tank[1]
        assert server.stop() == 0


async def test_chunk_responses_are_not_held_back(server_port: int) -> None:
    # Regression: the head sent with MSG_MORE before a sendfile left the end of the chunk
    # corked for ~200 ms per response (seen with the reader in another process and chunks
    # starting mid-file). Eight 1 MiB answers in well under 8 x 200 ms.
    pool = os.urandom(1 << 20)
    async with open_tank_client("127.0.0.1", server_port) as client:
        for _ in range(90):
            await client.produce({("fast", 0): [
                Message(pool[i * 1024:(i + 1) * 1024], timestamp=1) for i in range(100)]})
        seq = 1
        start = trio.current_time()
        for _ in range(8):
            result = await client.consume("fast", 0, seq, fetch_size=1 << 20)
            assert len(result.messages) >= 1000
            seq = result.next_seq
        assert trio.current_time() - start < 1.0
