"""Records per second of the batch <-> bundle mapping: ``python -m protocols.kafka.bench``.

Fetch path: framed Tank bundles -> Kafka batches (per fetch codec). Produce path:
Kafka batch bytes -> Tank bundle (per producer codec). 100-byte values, 16-byte keys,
500 records a bundle/batch. What the listener runs (compiled unless
``FIGTANK_PURE_PYTHON=1``); the produce rows also give the pure-Python reference.
"""

from __future__ import annotations

import timeit

from protocols.kafka.batch import Compression, RecordBatch, encode_batch, read_batch
from protocols.kafka.bundles import (
    bundles_to_batches,
    records_to_bundles,
    records_to_bundles_py,
)
from protocols.native import implementation
from protocols.tank.bundle import Codec, Message, encode_bundle, frame_bundle

_N = 500


def _rate(fn: object, records: int) -> float:
    runs = 20
    best = min(timeit.repeat(fn, number=runs, repeat=3))  # type: ignore[arg-type]
    return records * runs / best


def main() -> None:
    """Print records/s for each path and codec."""
    print(f"implementation: {implementation()}")
    messages = [Message(b"%03d" % i * 33 + b"x", b"key-%012d" % i, 1_700_000_000_000 + i)
                for i in range(_N)]
    for tank_codec in Codec:
        chunk = frame_bundle(encode_bundle(messages, codec=tank_codec))
        for fetch in (Compression.NONE, Compression.SNAPPY, Compression.LZ4):
            rate = _rate(lambda c=chunk, f=fetch: bundles_to_batches(c, 1, compression=f), _N)
            print(f"fetch   tank {tank_codec.name:6} -> kafka {fetch.name:6} {rate:12,.0f} rec/s")
    batch = bundles_to_batches(frame_bundle(encode_bundle(messages, codec=Codec.NONE)), 1)
    got = read_batch(batch.records)
    assert not isinstance(got, int)
    plain: RecordBatch = got[0]
    for codec in Compression:
        plain.attributes = int(codec)
        data = encode_batch(plain)

        fast = _rate(lambda d=data: records_to_bundles(d), _N)
        pure = _rate(lambda d=data: records_to_bundles_py(d), _N)
        print(f"produce kafka {codec.name:6} -> tank      {fast:12,.0f} rec/s  "
              f"(pure Python {pure:,.0f})")


if __name__ == "__main__":
    main()
