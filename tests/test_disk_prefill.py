"""The zeros ``fsync`` durability writes ahead of active segments never starve messages, on
a real 96 MiB tmpfs under a real ``figtank serve``: all of them together stay within
``store.max_prefill_bytes`` (the gauge says how much is held), they come only from the
space above the floor, and when space is short they are handed back before a message is
refused, so freed space goes to messages first."""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio

from gateway.client.tank import open_tank_client
from tests.disks import fill, tmpfs
from tests.serving import ServeProcess, figtank_serve
from tests.test_disk_full import metric, wait_metric
from tests.test_serve import http_get

MIB = 1024 * 1024
ANY_PORT = "127.0.0.1:0"


def disk_usage(path: Path) -> int:
    """Bytes the files under ``path`` hold on disk (their blocks, zeros included)."""
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512
               for d, _, files in os.walk(path) for f in files)


def wait_free_below(server: ServeProcess, directory: str, below: float,
                    timeout: float = 10) -> bool:
    """Poll until the server's free-space gauge is under ``below`` (it looked again)."""
    assert server.metrics is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = http_get(server.metrics, "/metrics")[1]
        free = metric(text, "figtank_store_free_bytes", directory=directory)
        if free is not None and free < below:
            return True
        time.sleep(0.1)
    return False


async def test_prefill_is_bounded_and_handed_back_to_messages(tmp_path: Path) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text("[store]\nmax_prefill_bytes = 10485760\n"
                      "[topics]\ndefault_partitions = 4\n")
    with tmpfs(tmp_path / "disk", 96 * MIB) as disk, figtank_serve(
            "--config", str(config), "--data-dir", str(disk / "data"),
            "--tank-listen", ANY_PORT, "--figg-listen", "", "--metrics-listen", ANY_PORT,
            "--grace", "0.5") as server:
        assert server.tank and server.metrics
        data = str(disk / "data")
        sent: dict[int, list[bytes]] = {p: [] for p in range(4)}
        async with open_tank_client(*server.tank) as tank:
            # One message to each of four partitions: 4 + 4 + 2 MiB of zeros ahead, and
            # none for the fourth (the bound: store.max_prefill_bytes, 10 MiB).
            first = {("events", p): [b"first %d " % p + b"." * 2048] for p in range(4)}
            await tank.produce(first)
            for (_, p), values in first.items():
                sent[p] += values
            assert await trio.to_thread.run_sync(
                wait_metric, server, "figtank_store_prefill_bytes", float(10 * MIB), {})
            assert 10 * MIB <= disk_usage(disk / "data") < 11 * MIB
            # Another writer leaves 1 MiB above the floor, 10 MiB of it held as zeros.
            floor = metric(http_get(server.metrics, "/metrics")[1],
                           "figtank_store_min_free_bytes", directory=data)
            assert floor == int(96 * MIB * 5 / 100)
            filler = fill(disk / "filler", leave=int(floor) + MIB)
            assert await trio.to_thread.run_sync(wait_free_below, server, data,
                                                 floor + 2 * MIB)
            # A 3 MiB message (to a partition with no zeros of its own) fits once the
            # zeros are handed back: it is stored.
            big = os.urandom(3 * MIB)  # (Tank's client compresses what it can)
            await tank.produce({("big", 0): [big]})
            assert [m.value for m in (await tank.consume(
                "big", 0, 1, fetch_size=8 * MIB)).messages] == [big]
            assert await trio.to_thread.run_sync(
                wait_metric, server, "figtank_store_prefill_bytes", 0.0, {})
            # The case: space freed, a small message to each partition, then a
            # 400 KB one: the small ones take no zeros (too little is free above the
            # floor), so the big one fits.
            filler.unlink()
            fill(disk / "filler2", leave=int(floor) + 8 * MIB)
            assert await trio.to_thread.run_sync(wait_free_below, server, data,
                                                 floor + 9 * MIB)
            small = {("events", p): [b"small %d " % p + b"." * 2048] for p in range(4)}
            await tank.produce(small)
            for (_, p), values in small.items():
                sent[p] += values
            medium = os.urandom(400_000)
            await tank.produce({("events", 1): [medium]})
            sent[1].append(medium)
            text = http_get(server.metrics, "/metrics")[1]
            assert metric(text, "figtank_store_prefill_bytes") == 0
            got = {p: [m.value for m in (await tank.consume(
                "events", p, 1, fetch_size=8 * MIB)).messages] for p in range(4)}
        assert server.stop() == 0
    assert got == sent
    handed = server.events("prefill_handed_back")
    assert [line["bytes"] for line in handed] == [10 * MIB], handed
    assert not server.events("segment_prefill_failed")
    assert not server.events("store_write_failed")
