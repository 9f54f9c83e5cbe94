"""A process killed with SIGKILL mid-stream loses no acknowledged append (fsync durability)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from protocols.tank.bundle import iter_framed_bundles
from tests.store.helpers import read_messages, store_at

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import sys
    import structlog
    import trio
    from gateway.store import NO_BOUNDS, StoreSettings, open_store
    from protocols.tank.bundle import Message, encode_bundle

    async def main(path, segment_bytes):
        settings = StoreSettings(durability="fsync", maintenance_interval=float("inf"),
                                 config_bounds=NO_BOUNDS)
        async with open_store(path, settings, maintenance=False) as store:
            await store.create_topic("k", 2, f"log.segment.bytes={segment_bytes}\\n")
            deadline = trio.current_time() + 20  # stops by itself if nobody kills it

            async def producer(pid):
                part = pid % 2
                i = 0
                while trio.current_time() < deadline:
                    n = i % 5 + 1
                    msgs = [Message(b"%d:%d:%d" % (pid, i, j) * 8) for j in range(n)]
                    r = await store.partition("k", part).append(encode_bundle(msgs))
                    sys.stdout.write(f"ACK {part} {r.first_seq} {r.last_seq} {pid} {i} {n}\\n")
                    sys.stdout.flush()
                    i += 1

            async with trio.open_nursery() as nursery:
                for pid in range(6):
                    nursery.start_soon(producer, pid)

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    trio.run(main, sys.argv[1], int(sys.argv[2]))
""")


# Small segments: the kill comes while segments roll. Large ones: it leaves megabytes of the
# zeros written ahead of the active segment's appends, which recovery trims.
@pytest.mark.parametrize("segment_bytes", [4096, 64 * 1024 * 1024])
async def test_sigkill_loses_no_acknowledged_append(tmp_path, segment_bytes):
    data = tmp_path / "data"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data), str(segment_bytes)],
                             cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    acked: list[tuple[int, ...]] = []
    try:
        assert child.stdout is not None
        started = time.monotonic()
        while len(acked) < 400 and time.monotonic() - started < 15:
            line = child.stdout.readline()
            if not line:
                break
            acked.append(tuple(int(x) for x in line.split()[1:]))
        child.send_signal(signal.SIGKILL)
        rest = child.stdout.read()  # acks printed before the kill
    finally:
        child.kill()
        child.wait(10)
    for line in rest.splitlines(keepends=True):
        if line.endswith(b"\n"):  # a line cut by the kill is not counted
            acked.append(tuple(int(x) for x in line.split()[1:]))
    assert len(acked) >= 100, "the child did not get going"
    actives = sorted(data.glob("k/*/*.log"))
    if segment_bytes > 4096:  # zeros were written ahead of the data in the active segments
        assert all(path.stat().st_size >= 4 << 20 for path in actives)
    async with store_at(data) as store:
        for part in (0, 1):
            p = store.partition("k", part)
            mine = [a for a in acked if a[0] == part]
            assert p.high_water_mark >= max(a[2] for a in mine)
            values = {}
            seq = 1
            while seq <= p.high_water_mark:
                msgs, seq = read_messages(p, seq, 1 << 16)
                values.update((m.seq, m.value) for m in msgs)
            assert sorted(values) == list(range(1, p.high_water_mark + 1))
            for _, first, last, pid, i, n in mine:
                assert last - first + 1 == n
                for j in range(n):
                    assert values[first + j] == b"%d:%d:%d" % (pid, i, j) * 8
            if segment_bytes == 4096:
                assert p.segment_count > 1  # the kill came while segments were rolling
            r = await p.append(b"\x04\x00" + bytes(8) + b"\x01x")
            assert r.first_seq == p.high_water_mark == max(values) + 1
    for path in data.glob("k/*/*.log"):  # recovery cut the zeros; close left none either
        content = path.read_bytes()
        assert sum(length for _, length, _ in iter_framed_bundles(content)) == len(content)
