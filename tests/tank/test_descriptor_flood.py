"""Issue 15, item 1: Tank connections that pipeline Consumes and never read do not cost a
descriptor per queued chunk (reads share their segment's one descriptor), so the server
keeps its descriptors, and other clients are served."""

from __future__ import annotations

import random

import trio

from gateway.client.tank import open_tank_client
from gateway.store.descriptors import open_descriptors
from tests.tank.helpers import RawClient, tank_server
from tests.tank.test_consume import consume_request

CONNECTIONS = 20
CONSUMES = 256
MIB = 1 << 20


async def test_unread_pipelined_consumes_hold_no_descriptor_each(tmp_path) -> None:
    # The tail cache off: every chunk is a range of the segment file (what a reader far
    # behind the tail gets), not bytes in memory.
    async with tank_server(tmp_path / "data", tail_cache_bytes=0) as server, \
            open_tank_client(server.host, server.port, request_timeout=10) as client:
        rng = random.Random(15)
        for _ in range(4):  # 4 MiB of data in the segment
            await client.produce({("flood", 0): [rng.randbytes(256 * 1024) for _ in range(4)]})
        base = open_descriptors()
        assert base is not None
        peers = [await RawClient.connect(server) for _ in range(CONNECTIONS)]
        peak = base
        with trio.move_on_after(3):
            async with trio.open_nursery() as nursery:
                for peer in peers:
                    requests = b"".join(
                        peer.conn.send(consume_request(i, [("flood", 0, 1)], fetch_size=MIB))
                        for i in range(CONSUMES))
                    nursery.start_soon(peer.stream.send_all, requests)
                for _ in range(20):  # while the server takes them in
                    await trio.sleep(0.05)
                    peak = max(peak, open_descriptors() or 0)
                nursery.cancel_scope.cancel()
        # Our 20 sockets and the server's 20: no descriptor per queued chunk (the code
        # before this change held 20 x 256 duplicated descriptors here).
        assert peak - base <= 2 * CONNECTIONS + 10, (base, peak)
        # A new client is served meanwhile.
        async with open_tank_client(server.host, server.port, request_timeout=5) as other:
            result = await other.consume("flood", 0, 1, fetch_size=1024)
            assert result.messages and result.messages[0].seq == 1
        for peer in peers:
            await peer.stream.aclose()
        with trio.fail_after(5):  # the queued chunks release their references
            while (open_descriptors() or 0) > base:
                await trio.sleep(0.05)
