"""Reading a planned sequence range from a Tank endpoint, on a Spark executor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from gateway.client.errors import BoundaryError
from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.options import TankOptions
from gateway.spark.planning import DataLossError, SequenceRange
from gateway.spark.rows import to_record_batch, to_tuples

#: The first Consume of a range asks this much; later ones are sized by what it found.
FIRST_FETCH: Final = 256 * 1024
MIN_FETCH: Final = 64 * 1024


def read_range(options: TankOptions, rng: SequenceRange) -> Iterator[Any]:
    """Rows (Arrow batches, or tuples with ``arrow=false``) of ``rng``, fetched with
    Consume requests of ``fetchBytes``.

    The client is made here, in the task, and closed when the iterator ends: nothing
    that holds a socket or a thread is ever pickled.
    """
    if rng.start >= rng.end:
        return
    topic, partition, end = rng.topic, rng.partition, rng.end
    fetch = min(FIRST_FETCH, options.fetch_bytes)
    with BlockingTankClient(options.host, options.port, **options.client_options()) as client:
        seq = rng.start
        while seq < end:
            try:
                result = client.consume(topic, partition, seq, fetch_size=fetch)
            except BoundaryError as exc:
                if options.fail_on_data_loss or exc.first_available <= seq:
                    raise DataLossError(
                        f"{topic}/{partition}: sequence {seq} is not available (first "
                        f"{exc.first_available}, high-water mark {exc.high_water_mark}); "
                        "failOnDataLoss=false skips removed messages") from exc
                seq = exc.first_available
                continue
            messages = result.messages
            if not messages:
                if result.next_seq > seq:  # a gap in the sequence numbers (compaction)
                    seq = result.next_seq
                    continue
                raise DataLossError(f"{topic}/{partition}: no message at sequence {seq} "
                                    f"although it was planned up to {end - 1} (high-water "
                                    f"mark now {result.high_water_mark})")
            # The client decodes every message of a chunk: ask for about what is left of
            # the range (by the density just seen), not a whole fetchBytes past its end.
            density = fetch / max(1, messages[-1].seq - seq + 1)
            fetch = int(min(options.fetch_bytes, max(MIN_FETCH, (end - messages[-1].seq)
                                                      * density * 1.1)))
            if messages[-1].seq >= end:
                messages = [m for m in messages if m.seq < end]
            if messages:
                if options.arrow:
                    yield to_record_batch(topic, partition, messages)
                else:
                    yield from to_tuples(topic, partition, messages)
            seq = result.next_seq
