"""Throughput of the embedded log store (gateway/store).

Run from the repository root::

    .venv/bin/python -m gateway.bench.micro.store [--seconds 2] [--dir /path/on/the/disk/to/test]

Appends: 1 KiB messages in bundles of 1, 100 and 1000 messages, in both durability
modes, by one producer and by ``--producers`` concurrent producers (where group commit
shows), each row timed for ``--seconds``. MB/s counts message payload bytes.
Reads: the whole partition is read back from sequence 1 with a 1 MiB fetch size,
once into memory (``read_bytes``) and once with ``os.sendfile`` to /dev/null.
Scan: the bundle-header walk that recovery runs over whole segments
(:class:`~gateway.store.scan.Scanner`), over a file of ``--scan-bundles`` small bundles,
plain and sparse mixed, best of five passes.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

import structlog
import trio

from gateway.store import StoreSettings, TopicConfig, open_store
from gateway.store.scan import Scanner
from gateway.store.segment import RECOVERY_WINDOW
from protocols.tank.bundle import Codec, Message, encode_bundle, frame_bundle

MIB = 1024 * 1024


async def bench_appends(path: str, mode: str, per_bundle: int, producers: int,
                        seconds: float, msg_size: int) -> tuple[float, float, int]:
    """(bundles/s, MB/s of payload, bytes appended) for one configuration."""
    rng = random.Random(per_bundle)
    data = encode_bundle([Message(rng.randbytes(msg_size), None, 1_700_000_000_000 + i)
                          for i in range(per_bundle)], codec=Codec.NONE)
    settings = StoreSettings(durability=mode, maintenance_interval=float("inf"),
                             topic_defaults=TopicConfig(segment_bytes=256 * MIB))
    count = 0
    async with open_store(path, settings, maintenance=False) as store:
        await store.create_topic("bench", 1)
        p = store.partition("bench", 0)
        deadline = trio.current_time() + seconds

        async def producer() -> None:
            nonlocal count
            while trio.current_time() < deadline:
                await p.append(data)
                count += 1

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(producers):
                nursery.start_soon(producer)
        elapsed = time.perf_counter() - start
        size = p.size_bytes
    rate = count / elapsed
    return rate, rate * per_bundle * msg_size / MIB, size


async def bench_reads(path: str) -> tuple[float, float, int]:
    """(MB/s via read_bytes, MB/s via sendfile, bytes read) over a whole partition."""
    settings = StoreSettings(durability="os", maintenance_interval=float("inf"))
    async with open_store(path, settings, maintenance=False) as store:
        p = store.partition("bench", 0)
        rates = []
        total = 0
        for use_sendfile in (False, True):
            devnull = os.open(os.devnull, os.O_WRONLY)
            total = 0
            seq = 1
            start = time.perf_counter()
            try:
                while seq <= p.high_water_mark:
                    with p.read(seq, MIB) as r:
                        if use_sendfile:
                            fd, offset = r.sendfile_source() or (-1, 0)
                            sent = 0
                            while sent < r.length:
                                sent += os.sendfile(devnull, fd, offset + sent, r.length - sent)
                        else:
                            r.read_bytes()
                        total += r.length
                        seq = r.next_seq
            finally:
                os.close(devnull)
            rates.append(total / MIB / (time.perf_counter() - start))
    return rates[0], rates[1], total


def bench_scan(root: str, bundles: int) -> tuple[float, float]:
    """(bundles/s, MB/s) of a recovery-sized header walk over ``bundles`` small bundles."""
    rng = random.Random(7)
    plain = [frame_bundle(encode_bundle([Message(rng.randbytes(100))] * n, codec=Codec.NONE))
             for n in (1, 3, 20)]
    path = os.path.join(root, "scan.log")
    seq = 1
    with open(path, "wb") as f:
        for i in range(bundles):
            if i % 10 == 9:  # a sparse bundle of two messages with a gap
                msgs = [Message(b"s", seq=seq + 1), Message(b"t", seq=seq + 5)]
                f.write(frame_bundle(encode_bundle(msgs, codec=Codec.NONE, sparse=True)))
                seq += 6
            else:
                framed = plain[i % 3]
                f.write(framed)
                seq += (1, 3, 20)[i % 3]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            walked = sum(1 for _ in Scanner(fd, RECOVERY_WINDOW).walk(0, size, 1))
            best = min(best, time.perf_counter() - start)
        assert walked == bundles
    finally:
        os.close(fd)
        os.unlink(path)
    return bundles / best, size / MIB / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per append row")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--producers", type=int, default=32, help="concurrent producers")
    parser.add_argument("--msg-size", type=int, default=1024, help="message value size")
    parser.add_argument("--bundles", default="1,100,1000", help="messages per bundle")
    parser.add_argument("--modes", default="fsync,os", help="durability modes")
    parser.add_argument("--scan-bundles", type=int, default=200_000,
                        help="bundles in the scanned file (0: no scan row)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    root = tempfile.mkdtemp(prefix="bench-store-", dir=args.dir)
    print(f"data in {root}; {args.msg_size}-byte messages, {args.seconds:g} s per row")
    print(f"{'mode':6} {'msgs/bundle':>11} {'producers':>9} {'bundles/s':>11} {'MB/s':>9}")
    try:
        read_dir = None
        for mode in args.modes.split(","):
            for per_bundle in (int(x) for x in args.bundles.split(",")):
                for producers in (1, args.producers):
                    path = os.path.join(root, f"{mode}-{per_bundle}-{producers}")
                    rate, mbs, _ = trio.run(bench_appends, path, mode, per_bundle, producers,
                                            args.seconds, args.msg_size)
                    print(f"{mode:6} {per_bundle:>11} {producers:>9} {rate:>11,.0f} {mbs:>9.1f}",
                          flush=True)
                    if read_dir is None or per_bundle == 100:
                        if read_dir and read_dir != path:
                            shutil.rmtree(read_dir, ignore_errors=True)
                        read_dir = path
                    else:
                        shutil.rmtree(path, ignore_errors=True)
        if read_dir:
            mem, sf, total = trio.run(bench_reads, read_dir)
            print(f"read {total / MIB:,.0f} MiB with 1 MiB fetches: "
                  f"read_bytes {mem:,.0f} MB/s, sendfile {sf:,.0f} MB/s")
        if args.scan_bundles > 0:
            rate, mbs = bench_scan(root, args.scan_bundles)
            print(f"scan {args.scan_bundles:,} bundle headers (recovery walk): "
                  f"{rate:,.0f} bundles/s, {mbs:,.0f} MB/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
