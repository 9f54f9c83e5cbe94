"""What exactly-once costs the ``figtank`` streaming sink: one task's write, both ways.

Run: ``python -m gateway.bench.micro.spark_sink [--messages 200000] [--size 100]
[--partitions 4] [--durability os] [--repeat 3]`` (needs the spark extra; no JVM).

A ``figtank serve`` child process on a temporary data directory; one Spark task's code
(:func:`gateway.spark.sink.write_batches`, the rows as Arrow batches of 10,000 keyed
messages of ``--size`` bytes, default ``batchMessages``) writes them to a new topic of
``--partitions`` partitions, at least once and exactly once (a task of a micro-batch of
its own each time). Printed: messages/s of each, every run and the best.
"""

from __future__ import annotations

import argparse
import time
import uuid

import pyarrow as pa

from gateway.bench.serving import serve_figtank
from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.exactly_once import TaskIdentity
from gateway.spark.options import tank_options
from gateway.spark.sink import write_batches


def rows(messages: int, size: int) -> list[pa.RecordBatch]:
    out = []
    for lo in range(0, messages, 10_000):
        span = range(lo, min(messages, lo + 10_000))
        values = [b"%010d" % i + b"x" * (size - 10) for i in span]
        keys = [b"k%d" % (i % 100) for i in span]
        out.append(pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.binary()),
                                               "value": pa.array(values, pa.binary())}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--durability", default="os", choices=("os", "fsync"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    batches = rows(args.messages, args.size)
    query = str(uuid.uuid4())
    with serve_figtank(durability=args.durability) as served:
        host, _, port = served.tank.rpartition(":")
        rates: dict[str, list[float]] = {"at least once": [], "exactly once": []}
        for run in range(args.repeat):
            for name in rates:
                topic = f"sink-{run}-{name.split()[0]}"
                with BlockingTankClient(host, int(port)) as client:
                    client.create_topic(topic, args.partitions)
                options = tank_options({"endpoint": served.tank, "topic": topic},
                                       streaming=True)
                task = (TaskIdentity(query, "bench", run, 0, f"bench/{run}")
                        if name == "exactly once" else None)
                start = time.perf_counter()
                report = write_batches(options, batches, task)
                rates[name].append(args.messages / (time.perf_counter() - start))
                assert sum(report.counts.values()) == args.messages
        print(f"{args.messages:,} x {args.size} B to {args.partitions} partitions, "
              f"durability={args.durability}:")
        for name, found in rates.items():
            print(f"  {name:13}: {' '.join(f'{r:,.0f}' for r in found)} msgs/s "
                  f"(best {max(found):,.0f})")


if __name__ == "__main__":
    main()
