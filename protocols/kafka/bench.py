"""Records per second of the batch <-> bundle mapping: ``python -m protocols.kafka.bench``.

Kafka listener. Fetch path: framed Tank bundles -> Kafka batches, a plain bundle as an
uncompressed batch and a Snappy bundle (what a compressed producer stored) in each codec
``kafka.fetch_compression`` may name, with the bytes a record takes on the wire: 500
JSON-like events a bundle (~125-byte values of random ids and words, 16-byte keys).
Produce path: Kafka batch bytes -> Tank bundle (per producer codec): 100-byte values,
16-byte keys, 500 records a batch. What the listener runs (compiled unless
``FIGTANK_PURE_PYTHON=1``); the produce rows also give the pure-Python reference.

Upstream Kafka client (:mod:`protocols.kafka.upstream_codec`), compiled and pure rows:
produce, 1000-message Tank bundles of 100-byte values (no keys, one timestamp) -> one
record batch; fetch, four 500-record batches of 100-byte values -> bundles.
"""

from __future__ import annotations

import json
import random
import timeit

from protocols.kafka import upstream_codec
from protocols.kafka.batch import Compression, Record, RecordBatch, encode_batch, read_batch
from protocols.kafka.bundles import (
    bundles_to_batches,
    fetch_codecs,
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


def events(count: int, seed: int = 1) -> list[Message]:
    """``count`` JSON-like events (what compresses like real data: ids, words, times)."""
    rng = random.Random(seed)
    words = ("click", "view", "buy", "scroll", "search", "login")
    return [Message(json.dumps({
        "id": rng.randrange(10**9), "user": f"user-{rng.randrange(100_000)}",
        "event": rng.choice(words), "ts": 1_700_000_000_000 + 7 * i,
        "session": rng.randbytes(8).hex(), "amount": round(rng.random() * 100, 2),
    }).encode(), b"key-%012d" % rng.randrange(10**12), 1_700_000_000_000 + 7 * i)
        for i in range(count)]


def fetch_rows() -> None:
    """Print records/s and wire bytes a record of each fetch codec."""
    messages = events(_N)
    plain = frame_bundle(encode_bundle(messages, codec=Codec.NONE))
    rows = [(Codec.NONE, Compression.NONE, plain)]
    snappy = frame_bundle(encode_bundle(messages, codec=Codec.SNAPPY))
    rows += [(Codec.SNAPPY, codec, snappy) for codec in Compression]
    for tank_codec, codec, chunk in rows:
        codecs = fetch_codecs(codec)
        rate = _rate(lambda c=chunk, f=codecs: bundles_to_batches(c, 1, codecs=f), _N)
        size = len(bundles_to_batches(chunk, 1, codecs=codecs).records)
        print(f"fetch   tank {tank_codec.name:6} -> kafka {codec.name:6} {rate:12,.0f} rec/s"
              f"  {size / _N:6.1f} bytes/rec")


def main() -> None:
    """Print records/s for each path and codec."""
    print(f"implementation: {implementation()}")
    fetch_rows()
    messages = [Message(b"%03d" % i * 33 + b"x", b"key-%012d" % i, 1_700_000_000_000 + i)
                for i in range(_N)]
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
