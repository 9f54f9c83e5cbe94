"""Throughput of the Tank bundle codec (protocols/tank/bundle.py).

Run from the repository root::

    .venv/bin/python -m gateway.bench.micro.bundle [--compressible] [--sizes 100,1024]

Each row encodes or decodes bundles of ``--per-bundle`` messages and reports the best of
``--repeat`` timed runs. MB/s counts message payload bytes (values), not bundle bytes.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from functools import partial

from gateway.bench.stats import best_rate
from protocols.tank.bundle import (
    Codec,
    Message,
    decode_bundle,
    decode_chunk,
    encode_bundle,
    frame_bundle,
    validate_bundle,
)

TS = 1_700_000_000_000
WORDS = b"tank figg bundle segment offset partition topic consumer producer sequence".split()


def payload(rng: random.Random, size: int, compressible: bool) -> bytes:
    if not compressible:
        return rng.randbytes(size)
    text = b" ".join(rng.choice(WORDS) for _ in range(size // 4 + 1))
    return text[:size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes (comma list)")
    parser.add_argument("--per-bundle", type=int, default=1000, help="messages per bundle")
    parser.add_argument("--chunk-bundles", type=int, default=10, help="bundles per chunk")
    parser.add_argument("--compressible", action="store_true", help="text-like payloads")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=0.5, help="minimum time per run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    kind = "compressible" if args.compressible else "random"
    print(f"{args.per_bundle} messages per bundle, {kind} payloads, best of {args.repeat}")
    header = f"{'operation':<14}{'value':>7}  {'codec':<7}{'msg/s':>12}{'MB/s':>9}{'bundle B':>10}"
    print(header)
    print("-" * len(header))
    for size in (int(s) for s in args.sizes.split(",")):
        messages = [
            Message(payload(rng, size, args.compressible), None, TS) for _ in range(args.per_bundle)
        ]
        payload_bytes = size * args.per_bundle
        for codec in (Codec.NONE, Codec.SNAPPY):
            bundle = encode_bundle(messages, codec=codec)
            chunk = frame_bundle(bundle) * args.chunk_bundles
            rows: list[tuple[str, Callable[[], object], int]] = [
                ("encode", partial(encode_bundle, messages, codec=codec), 1),
                ("decode", partial(decode_bundle, bundle, 1), 1),
                ("decode_chunk", partial(decode_chunk, chunk, 1), args.chunk_bundles),
                ("validate", partial(validate_bundle, bundle), 1),
            ]
            for name, fn, bundles_per_call in rows:
                calls = best_rate(fn, args.seconds, args.repeat)
                msgs = calls * bundles_per_call * args.per_bundle
                mbs = calls * bundles_per_call * payload_bytes / 1e6
                print(
                    f"{name:<14}{size:>7}  {codec.name.lower():<7}{msgs:>12,.0f}{mbs:>9,.1f}"
                    f"{len(bundle):>10,}"
                )


if __name__ == "__main__":
    main()
