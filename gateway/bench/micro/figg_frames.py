"""Figg framing speed: PUBLISH parsing on the server, DATA encoding and parsing.

Run: ``python -m gateway.bench.micro.figg_frames [--frames N] [--repeat R] [--sizes 128 1024]``.
Each figure is the best of ``--repeat`` runs over a buffer of ``--frames`` frames;
MB/s counts wire bytes (headers included), 1 MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from protocols.connection import Role
from protocols.figg.connection import FiggConnection, encode_data_frames
from protocols.figg.messages import CODECS, FAST, HEADER, MessageType

TOPIC = b"orders-eu-1"


def best_time(run: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def parse_all(role: Role, wire: bytes, frames: int) -> None:
    conn = FiggConnection(role)
    conn.receive_data(wire)
    if len(conn.next_events()) != frames:
        raise AssertionError("lost frames")


def bench(size: int, frames: int, repeat: int) -> list[tuple[str, float, int]]:
    """``(label, seconds, wire bytes)`` for each measured operation at one data size."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    items = [(offset, data) for offset in range(1, frames + 1)]
    publish = b"".join(FAST[MessageType.PUBLISH].encode_frame(TOPIC, n, data)
                       for n in range(frames))
    data_wire = encode_data_frames(TOPIC, items)
    engine, fast = CODECS["Publish"], FAST[MessageType.PUBLISH]
    encode_data = FAST[MessageType.DATA].encode_frame
    payloads = [publish[i + HEADER.size:i + len(publish) // frames]
                for i in range(0, len(publish), len(publish) // frames)]
    return [
        ("PUBLISH parse (server next_events)",
         best_time(lambda: parse_all(Role.SERVER, publish, frames), repeat), len(publish)),
        ("PUBLISH decode, generated codec (payload only)",
         best_time(lambda: [fast.decode(p) for p in payloads], repeat), len(publish)),
        ("PUBLISH decode, generic engine (payload only)",
         best_time(lambda: [engine.decode(p, version=1) for p in payloads], repeat),
         len(publish)),
        ("DATA encode, encode_data_frames (batched)",
         best_time(lambda: encode_data_frames(TOPIC, items), repeat), len(data_wire)),
        ("DATA encode, generated codec (one frame a call)",
         best_time(lambda: [encode_data(TOPIC, o, d) for o, d in items], repeat),
         len(data_wire)),
        ("DATA parse (client next_events)",
         best_time(lambda: parse_all(Role.CLIENT, data_wire, frames), repeat), len(data_wire)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_000, help="frames per run")
    parser.add_argument("--repeat", type=int, default=7, help="runs per figure (best kept)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 1024],
                        help="data sizes in bytes")
    args = parser.parse_args()
    print(f"{'operation':<50} {'data':>6} {'frames/s':>12} {'MB/s':>9}")
    for size in args.sizes:
        for label, seconds, wire in bench(size, args.frames, args.repeat):
            print(f"{label:<50} {size:>5}B {args.frames / seconds:>12,.0f} "
                  f"{wire / seconds / 1e6:>9.1f}")


if __name__ == "__main__":
    main()
