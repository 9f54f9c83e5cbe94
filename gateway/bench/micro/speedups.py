"""The compiled inner loops (``protocols._speedups``) against their pure-Python references.

Run from the repository root (the extension must be built: ``make .venv/.installed``)::

    .venv/bin/python -m gateway.bench.micro.speedups [--min-seconds 0.5] [--repeat 3]

Each row times one call on the same input through the pure function and through the
compiled one (best of ``--repeat`` runs of at least ``--min-seconds``), and prints
messages per second for both and the ratio.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from functools import partial
from unittest import mock

from gateway.bench.stats import best_rate
from protocols import native, translate
from protocols.figg.messages import FAST, MessageType
from protocols.tank import bundle as B
from protocols.tank.bundle import Codec, Message, encode_bundle, frame_bundle

TS = 1_700_000_000_000
TOPIC = b"orders"
CHUNK_BYTES = 256 * 1024
VALUE_SIZE = 128


def values(rng: random.Random, count: int, size: int) -> list[bytes]:
    # Text-like, so Snappy has something to do.
    words = b"tank figg bundle segment offset partition topic consumer".split()
    return [b" ".join(rng.choice(words) for _ in range(size // 4 + 1))[:size]
            for _ in range(count)]


def chunk_of(rng: random.Random, per_bundle: int, codec: Codec) -> bytes:
    """About 256 KiB of framed bundles of ``per_bundle`` 128-byte messages."""
    parts, size = [], 0
    while size < CHUNK_BYTES:
        framed = frame_bundle(encode_bundle(
            [Message(v, timestamp=TS) for v in values(rng, per_bundle, VALUE_SIZE)],
            codec=codec))
        parts.append(framed)
        size += len(framed)
    return b"".join(parts)


def publishes(rng: random.Random) -> tuple[bytearray, int]:
    """256 KiB of PUBLISH frames with 128-byte values, over three topics in runs."""
    encode = FAST[MessageType.PUBLISH].encode_frame
    parts, size, seq = [], 0, 0
    while size < CHUNK_BYTES:
        topic = rng.choice([b"orders", b"events", b"metrics"])
        for value in values(rng, rng.randrange(1, 50), VALUE_SIZE):
            seq += 1
            parts.append(encode(topic, seq, value))
            size += len(parts[-1])
    return bytearray(b"".join(parts)), seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-seconds", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if native.speedups is None:
        sys.exit("protocols._speedups is not in use (not built, or FIGTANK_PURE_PYTHON set)")
    rng = random.Random(0xBE7C)
    cases: list[tuple[str, int, Callable[[], object], Callable[[], object]]] = []

    for count in (100, 1000):
        for codec in (Codec.NONE, Codec.SNAPPY):
            bundle = encode_bundle([Message(v, timestamp=TS) for v in values(rng, count, 100)],
                                   codec=codec)
            cases.append((f"validate_bundle {count} x 100 B {codec.name.lower()}", count,
                          partial(B.validate_bundle_py, bundle),
                          partial(B.validate_bundle, bundle)))

    buf, frames = publishes(rng)
    cases.append((f"scan_publishes 256 KiB, {VALUE_SIZE} B values", frames,
                  lambda: translate.scan_publishes_py(buf, 0, len(buf), 1 << 26, TS),
                  lambda: translate.scan_publishes(buf, 0, len(buf), 1 << 26, TS)))

    for per_bundle, codec in ((100, Codec.NONE), (1000, Codec.SNAPPY)):
        chunk = chunk_of(rng, per_bundle, codec)
        count = len(B.decode_chunk_py(chunk, 1).messages)
        name = f"256 KiB chunk, {per_bundle}-message {codec.name.lower()} bundles"
        cases.append((f"data_frames {name}", count,
                      partial(translate.data_frames_py, TOPIC, chunk, 1),
                      partial(translate.data_frames, TOPIC, chunk, 1)))
        cases.append((f"decode_chunk {name}", count,
                      partial(B.decode_chunk_py, chunk, 1),
                      partial(B.decode_chunk, chunk, 1)))

    print(f"{'case':<62} {'pure msg/s':>13} {'compiled msg/s':>15} {'x':>6}")
    for name, messages, pure, compiled in cases:
        # data_frames_py is made of decode_chunk: time it on the pure one.
        with mock.patch.object(translate, "decode_chunk", B.decode_chunk_py):
            pure_rate = best_rate(pure, args.min_seconds, args.repeat) * messages
        compiled_rate = best_rate(compiled, args.min_seconds, args.repeat) * messages
        print(f"{name:<62} {pure_rate:>13,.0f} {compiled_rate:>15,.0f} "
              f"{compiled_rate / pure_rate:>6.1f}")


if __name__ == "__main__":
    main()
