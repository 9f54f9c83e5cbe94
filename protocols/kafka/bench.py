"""Records per second of the batch <-> bundle mapping: ``python -m protocols.kafka.bench``.

Kafka listener. Fetch path: framed Tank bundles -> Kafka batches (per fetch codec).
Produce path: Kafka batch bytes -> Tank bundle (per producer codec). 100-byte values,
16-byte keys, 500 records a bundle/batch. What the listener runs (compiled unless
``FIGTANK_PURE_PYTHON=1``); the produce rows also give the pure-Python reference.

Upstream Kafka client (:mod:`protocols.kafka.upstream_codec`), compiled and pure rows:
produce, 1000-message Tank bundles of 100-byte values (no keys, one timestamp) -> one
record batch; fetch, four 500-record batches of 100-byte values -> bundles.
"""

from __future__ import annotations

import timeit

from protocols.kafka import upstream_codec
from protocols.kafka.batch import Compression, Record, RecordBatch, encode_batch, read_batch
from protocols.kafka.bundles import (
    bundles_to_batches,
    records_to_bundles,
    records_to_bundles_py,
)
from protocols.native import implementation
from protocols.tank.bundle import Codec, Message, encode_bundle, frame_bundle

_N = 500


def _rate(fn: object, records: int, runs: int = 20) -> float:
    best = min(timeit.repeat(fn, number=runs, repeat=3))  # type: ignore[arg-type]
    return records * runs / best


def upstream() -> None:
    """Print messages/s of the upstream client's codec, compiled (when built) and pure."""
    n = 1000
    bundle = encode_bundle([Message(b"%03d" % (i % 1000) * 33 + b"x", None, 1_700_000_000_000)
                            for i in range(n)], codec=Codec.NONE)
    stamp = {"producer_id": 1, "producer_epoch": 0, "base_sequence": 0, "now_ms": 1}
    size = 500
    records = [Record(i, i // 50, None, b"%03d" % i * 33 + b"x") for i in range(size)]
    fetched = b"".join(encode_batch(RecordBatch(size * k, 1_700_000_000_000,
                                                1_700_000_000_010, size - 1, records))
                       for k in range(4))
    twins = [("pure", upstream_codec.bundles_to_record_batch_py,
              upstream_codec.record_batches_to_bundles_py)]
    if upstream_codec._COMPILED:
        twins.insert(0, ("compiled", upstream_codec._bundles_to_record_batch_native,
                         upstream_codec._record_batches_to_bundles_native))
    for name, produce, fetch in twins:
        runs = 200 if name == "compiled" else 5
        rate = _rate(lambda p=produce: p([bundle], **stamp), n, runs)
        print(f"{f'upstream produce: a {n}-message bundle -> batch':52} {name:8} "
              f"{rate:12,.0f} msgs/s")
        rate = _rate(lambda f=fetch: f(fetched, from_offset=0, after_seq=None), 4 * size,
                     runs // 2)
        print(f"{f'upstream fetch: 4 batches of {size} records -> bundles':52} {name:8} "
              f"{rate:12,.0f} msgs/s")


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
    upstream()


if __name__ == "__main__":
    main()
