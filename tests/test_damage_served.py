"""Damage and the sequence-space guard as clients see them: Tank and Figg over loopback."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from gateway.backend.embedded import EmbeddedBackend
from gateway.client.errors import ProduceFailed
from gateway.client.tank import Message, TankClient, open_tank_client
from gateway.core.config import Settings
from gateway.store import StoreSettings, open_store
from protocols.figg.records import Attached
from protocols.tank.bundle import frame_bundle
from protocols.tank.types import ProduceError
from tests.figg.helpers import RawPeer, attach, figg_server, publish
from tests.store.helpers import as_tuples, bundle, read_messages, store_at
from tests.tank.helpers import serving, tank_server

U64 = 1 << 64


async def consume_all(client: TankClient, topic: str = "t") -> list[tuple]:
    """Every message of partition 0 from the first available, Consume after Consume."""
    out: list = []
    seq = 0
    while True:
        result = await client.consume(topic, 0, seq, fetch_size=64)
        if not result.messages:
            return out
        out += [(m.seq, m.value, m.key, m.timestamp) for m in result.messages]
        seq = result.next_seq


async def build(data: Path, appends: int = 60) -> tuple[list, list[Path]]:
    """Topic ``t``: many small rolled segments. Returns its messages and rolled files."""
    async with store_at(data, "os", segment_bytes=400, index_interval_bytes=128) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        for i in range(appends):
            await p.append(bundle(2, f"r{i}", size=10))
        seq, expected = 0, []
        while True:
            batch, seq = read_messages(p, seq, 1 << 20)
            if not batch:
                break
            expected += as_tuples(batch)
    return expected, sorted((data / "t" / "0").glob("*.ilog"),
                            key=lambda f: int(f.name.split("-")[0]))


def garbage(seed: int) -> bytes:
    """100 bytes that frame as one bundle (a length of 99, then noise): a reader that
    trusts the framing serves them whole."""
    return b"\x63" + random.Random(seed).randbytes(99)


def last_seq(segment: Path) -> int:
    return int(segment.name.split("_")[0].split("-")[1])


@pytest.mark.parametrize("how", ["sparse", "with_seqnum"])
async def test_a_produce_at_the_end_of_the_sequence_space_is_refused_with_code_10(
        tmp_path, how):
    data = tmp_path / "data"
    async with tank_server(data) as server, open_tank_client(
            server.host, server.port, request_timeout=10) as client:
        await client.produce({("t", 0): [b"one"]})
        with capture_logs() as logs, pytest.raises(ProduceFailed) as caught:
            if how == "sparse":
                await client.produce({("t", 0): [Message(b"far", timestamp=1, seq=U64 - 3),
                                                 Message(b"end", timestamp=1, seq=U64 - 2)]},
                                     sparse=True)
            else:
                await client.produce_with_seqnum({("t", 0): (U64 - 3, [b"far", b"end"])})
        assert caught.value.errors == {("t", 0): ProduceError.INVALID_SEQUENCE}
        assert any(e["event"] == "produce_sequence_refused" for e in logs)
        await client.produce({("t", 0): [b"two"]})
        assert [m[:2] for m in await consume_all(client)] == [(1, b"one"), (2, b"two")]
    async with tank_server(data) as server, open_tank_client(
            server.host, server.port, request_timeout=10) as client:
        await client.produce({("t", 0): [b"three"]})
        assert [m[:2] for m in await consume_all(client)] == [
            (1, b"one"), (2, b"two"), (3, b"three")]


async def test_tank_consume_skips_a_truncated_rolled_segment(tmp_path):
    data = tmp_path / "data"
    expected, files = await build(data)
    victim = files[1]
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2 + 7)
    with capture_logs() as logs:
        async with tank_server(data) as server, open_tank_client(
                server.host, server.port, request_timeout=10) as client:
            got = await consume_all(client)
            again = await consume_all(client)
            events = server.metric("figtank_data_loss_events_total")
            messages = server.metric("figtank_data_loss_messages_total")
    seqs = {m[0] for m in got}
    lost = [m[0] for m in expected if m[0] not in seqs]
    assert lost and lost[-1] == last_seq(victim) and lost == list(range(lost[0], lost[-1] + 1))
    assert got == [m for m in expected if m[0] in seqs] and got == again
    assert got[-1] == expected[-1]  # the segments after the damage are reachable
    (event,) = [e for e in logs if e["event"] == "data_loss"]
    assert (event["topic"], event["partition"], event["segment"]) == ("t", 0, victim.name)
    assert (event["first_seq"], event["last_seq"], event["messages"]) == (
        lost[0], lost[-1], len(lost))
    assert (events, messages) == (1, len(lost))


async def test_garbage_after_a_rolled_segment_is_never_served(tmp_path):
    data = tmp_path / "data"
    expected, files = await build(data)
    with open(files[2], "ab") as f:
        f.write(garbage(5))
    async with tank_server(data) as server, open_tank_client(
            server.host, server.port, request_timeout=10) as client:
        assert await consume_all(client) == expected
        assert server.metric("figtank_data_loss_bytes_total") == 100


async def figg_replay(server: Any, topic: str, count: int) -> list[tuple[int, bytes]]:
    """A Figg subscriber attached from offset 0: the first ``count`` DATA it gets."""
    peer = await RawPeer.connect(server)
    await peer.send(attach(topic, 0))
    (attached,) = await peer.receive(1)
    assert isinstance(attached, Attached)
    got = [(d.offset, d.data) for d in await peer.receive(count)]
    await peer.stream.aclose()
    return got


@pytest.mark.parametrize("damage", ["garbage", "phantom", "truncated"])
async def test_a_figg_replay_from_0_continues_past_damage_and_into_live_messages(
        tmp_path, damage):
    data = tmp_path / "data"
    expected, files = await build(data)
    victim = files[2]
    if damage == "garbage":
        with open(victim, "ab") as f:
            f.write(garbage(6))
    elif damage == "phantom":  # a whole, valid bundle the segment's name does not cover
        with open(victim, "ab") as f:
            f.write(frame_bundle(bundle(2, "phantom")))
    else:
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size - 3)
    # cutting 3 bytes loses the segment's last bundle (2 messages); garbage loses nothing
    lost = {last_seq(victim) - 1, last_seq(victim)} if damage == "truncated" else set()
    readable = [m for m in expected if m[0] not in lost]
    backend_cm = open_store(data, StoreSettings(durability="os"))
    with trio.fail_after(20):
        async with backend_cm as store:
            backend = EmbeddedBackend(store)
            async with figg_server(backend) as server:
                pub = await RawPeer.connect(server)
                live = [(b"live%d" % i) for i in range(3)]
                await pub.send(*(publish("t", i + 1, v) for i, v in enumerate(live)))
                await pub.receive(3)
                got = await figg_replay(server, "t", len(readable) + 3)
    assert got[:len(readable)] == [(m[0], m[1]) for m in readable]
    hwm = expected[-1][0]
    assert got[len(readable):] == [(hwm + 1 + i, v) for i, v in enumerate(live)]


async def test_a_big_segment_checked_in_a_worker_thread_is_served_to_both_protocols(
        tmp_path):
    data = tmp_path / "data"
    expected, files = await build(data)
    with open(files[0], "r+b") as f:
        f.truncate(files[0].stat().st_size - 3)
    lost_last = last_seq(files[0])
    readable = [m for m in expected if not lost_last - 1 <= m[0] <= lost_last]
    with trio.fail_after(20):
        async with open_store(data, StoreSettings(durability="os",
                                                  inline_check_bytes=0)) as store:
            backend = EmbeddedBackend(store)
            async with serving(backend, Settings()) as server, open_tank_client(
                    server.host, server.port, request_timeout=10) as client:
                assert await consume_all(client) == readable
        async with open_store(data, StoreSettings(durability="os", inline_check_bytes=0)
                              ) as store, figg_server(EmbeddedBackend(store)) as server:
            got = await figg_replay(server, "t", len(readable))
    assert got == [(m[0], m[1]) for m in readable]


async def test_startup_mode_reports_the_damage_before_anything_is_read(tmp_path):
    data = tmp_path / "data"
    _expected, files = await build(data)
    with open(files[3], "ab") as f:
        f.write(garbage(7))
    with capture_logs() as logs:
        async with tank_server(data, check_rolled_segments="startup") as server:
            found = [e for e in logs if e["event"] == "data_loss"]
            assert [e["segment"] for e in found] == [files[3].name]
            assert server.metric("figtank_data_loss_events_total") == 1


async def test_inspect_lists_the_damaged_regions_and_the_readable_messages(tmp_path):
    data = tmp_path / "data"
    expected, files = await build(data)
    size = files[1].stat().st_size
    with open(files[1], "r+b") as f:
        f.truncate(size - 3)
    shown = subprocess.run([sys.executable, "-m", "gateway.cli", "inspect", "--json",
                            str(data / "t" / "0")], capture_output=True, text=True,
                           timeout=30)
    assert shown.returncode == 1
    assert shown.stderr.strip() == (f"figtank inspect: {files[1].name}: 1 damaged region "
                                    "(skipped)")
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    (damage,) = [line for line in lines if line["kind"] == "damage"]
    last = last_seq(files[1])
    assert (damage["segment"], damage["first_seq"], damage["last_seq"]) == (
        files[1].name, last - 1, last)
    assert damage["offset"] + damage["bytes"] == size - 3
    seqs = [line["seq"] for line in lines if line["kind"] == "message"]
    assert seqs == [m[0] for m in expected if m[0] not in (last - 1, last)]
