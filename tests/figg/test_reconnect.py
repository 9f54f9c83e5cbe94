"""Reconnects through a proxy that cuts connections mid-stream, in both directions.

No acknowledged publish is lost, and the subscriber sees every message at least once, in
log order, once repeated offsets are dropped.
"""

from __future__ import annotations

import random

import pytest
import trio

from gateway.client.figg import FiggMessage, open_figg_client
from gateway.core.contract import Backend, FetchRequest
from protocols.tank.bundle import decode_chunk
from tests.figg.helpers import figg_server, open_test_backend
from tests.figg.proxy import dropping_proxy

N = 3000
PAYLOAD = 100
OPTIONS = {"backoff": lambda attempt: 0.0 if attempt == 0 else 0.01, "ping_interval": 0.5}


def payload(i: int) -> bytes:
    return b"%06d" % i + b"." * (PAYLOAD - 6)


@pytest.mark.parametrize("cut", ["upstream", "downstream", "both"])
async def test_no_acked_publish_lost_and_subscriber_in_order(tmp_path, cut):
    rng = random.Random(cut)
    acked: list[int] = []
    received: list[FiggMessage] = []
    with trio.fail_after(30):
        async with open_test_backend(tmp_path) as backend, \
                figg_server(backend) as server, \
                dropping_proxy(server.host, server.port) as pub_proxy, \
                dropping_proxy(server.host, server.port) as sub_proxy:
            if cut in ("upstream", "both"):
                pub_proxy.cut_upstream_after = rng.randrange(40_000, 80_000)
            if cut in ("downstream", "both"):
                sub_proxy.cut_downstream_after = rng.randrange(20_000, 60_000)
            async with open_figg_client(server.host, sub_proxy.port, **OPTIONS) as sub_client, \
                    open_figg_client(server.host, pub_proxy.port, **OPTIONS) as pub_client:
                sub = await sub_client.subscribe("rc", from_offset=0)
                done = trio.Event()

                async def consume() -> None:
                    async for message in sub:
                        received.append(message)
                        if done.is_set() and message.offset >= high_water_mark:
                            return

                async def chaos() -> None:
                    # A connection is cut again only once it carried an answer since its
                    # last cut: a client gives up on a server that closes it three times in
                    # a row without answering (a refusal), which a slow run (pure Python,
                    # a busy machine) would otherwise make of these cuts.
                    seen = {pub_proxy: -1, sub_proxy: -1}
                    while True:
                        await trio.sleep(rng.uniform(0.02, 0.08))
                        if cut == "both":
                            proxy = rng.choice((pub_proxy, sub_proxy))
                            answers = len(acked) if proxy is pub_proxy else len(received)
                            if answers != seen[proxy]:
                                seen[proxy] = answers
                                proxy.drop()

                high_water_mark = 1 << 64
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    nursery.start_soon(chaos)
                    for i in range(N):
                        await pub_client.publish("rc", payload(i), acked.append)
                    await pub_client.wait_all_acked()
                    [info] = await backend.discover_partitions("rc")
                    high_water_mark = info.high_water_mark
                    done.set()
                    while not received or received[-1].offset < high_water_mark:
                        await trio.sleep(0.01)
                    nursery.cancel_scope.cancel()
            cuts = pub_proxy.connections + sub_proxy.connections - 2
            assert cuts >= 3, cuts
            print(f"{cut}: {pub_proxy.connections} publisher and {sub_proxy.connections} "
                  f"subscriber connections")
            log = await read_log(backend, "rc")

    assert sorted(acked) == list(range(1, N + 1))
    # Every acknowledged publish is in the log; resends may repeat some, never reorder.
    firsts = {}
    for seq, value in log:
        firsts.setdefault(value, seq)
    assert set(firsts) == {payload(i) for i in range(N)}
    assert sorted(firsts, key=firsts.get) == [payload(i) for i in range(N)]
    assert len(log) >= N
    # The subscriber: in order, and after dropping repeated offsets, exactly the log.
    offsets = [m.offset for m in received]
    assert offsets == sorted(offsets)
    # The client resumes after the last offset it received, so not even a repeat here.
    assert len(set(offsets)) == len(offsets)
    deduped = {}
    for m in received:
        deduped.setdefault(m.offset, m.data)
    assert list(deduped.items()) == log


async def read_log(backend: Backend, topic: str) -> list[tuple[int, bytes]]:
    """Every message of partition 0, through the backend."""
    out: list[tuple[int, bytes]] = []
    seq = 1
    while True:
        [o] = await backend.fetch([FetchRequest(topic, 0, seq, 1 << 20)], max_wait_ms=0,
                                  min_bytes=0)
        data = o.chunk.read_bytes()
        o.chunk.close()
        if not data:
            return out
        result = decode_chunk(data, o.base_seq, seq)
        out += [(m.seq, m.value) for m in result.messages]
        seq = result.next_seq
