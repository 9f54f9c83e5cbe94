"""The ``figtank`` source reads through a gateway in upstream-Kafka mode: Spark talks Tank
to a ``figtank serve --upstream-kafka`` process in front of another ``figtank serve``
process (the upstream cluster). Rows are what was produced, at sequence = Kafka offset + 1.
The exactly-once sink, which places messages at sequence numbers it chooses, is refused
there with a clear error.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pytest

from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.exactly_once import TaskIdentity
from gateway.spark.options import tank_options
from gateway.spark.producer import WriteFailed
from gateway.spark.sink import write_batches
from protocols.tank.bundle import Message
from tests.serving import figtank_serve
from tests.spark.helpers import Row, rows_of
from tests.upstream_kafka.helpers import Upstream, gateway

START_TS = 1_700_000_000_000


def _produce_upstream(address: str, topic: str, count: int) -> list[Row]:
    """Produce ``count`` keyed messages over two partitions straight to the upstream with
    librdkafka; the rows Spark must read, at sequence = the offset it reported + 1."""
    producer = ck.Producer({"bootstrap.servers": address, "acks": "all",
                            "enable.idempotence": True})
    rows: list[Row] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        rows.append((msg.partition(), msg.offset() + 1, msg.timestamp()[1], msg.key(),
                     msg.value()))

    for i in range(count):
        producer.produce(topic, b"kafka-%d" % i, b"k%d" % (i % 3), partition=i % 2,
                         timestamp=START_TS + i, on_delivery=delivered)
    assert producer.flush(15) == 0
    return rows


def test_the_source_reads_through_a_gateway_in_upstream_kafka_mode(
        spark: Any, tmp_path: Path) -> None:
    upstream = Upstream(tmp_path / "up")
    with figtank_serve(*upstream.served.args) as _, \
            figtank_serve(*gateway(upstream.address).args) as front:
        assert front.tank
        with BlockingTankClient(*front.tank, request_timeout=15) as tank:
            tank.create_topic("spark-up", 2)
        rows = _produce_upstream(upstream.address, "spark-up", 60)
        with BlockingTankClient(*front.tank, request_timeout=15) as tank:
            tank.produce({("spark-up", 1): [Message(b"tank-%d" % i, None, START_TS + 100 + i)
                                            for i in range(5)]})
        rows += [(1, 31 + i, START_TS + 100 + i, None, b"tank-%d" % i) for i in range(5)]
        host, port = front.tank
        read = (spark.read.format("figtank").option("endpoint", f"{host}:{port}")
                .option("topic", "spark-up"))
        assert rows_of(read.load()) == sorted(rows)
        # A sequence range: Kafka offsets 10..19 of partition 0.
        ranged = read.option("partitions", "0").option("startingSequence", 11) \
            .option("endingSequence", 21).load()
        assert rows_of(ranged) == sorted(r for r in rows if r[0] == 0 and 11 <= r[1] < 21)


def test_exactly_once_writes_say_an_upstream_kafka_gateway_can_not_take_them(
        tmp_path: Path) -> None:
    """Such a gateway refuses every ProduceWithSeqnum (the cluster numbers records): an
    exactly-once write must say so, not take it for another writer being first forever;
    with exactlyOnce=false the same rows are written (at least once)."""
    upstream = Upstream(tmp_path / "up")
    with figtank_serve(*upstream.served.args) as _, \
            figtank_serve(*gateway(upstream.address).args) as front:
        assert front.tank
        host, port = front.tank
        with BlockingTankClient(host, port, request_timeout=15) as tank:
            tank.create_topic("spark-up-out", 1)
        batch = pa.RecordBatch.from_pydict({"value": pa.array([b"a", b"b"], pa.binary())})
        options = {"endpoint": f"{host}:{port}", "topic": "spark-up-out"}
        task = TaskIdentity(str(uuid.uuid4()), "run", 0, 0, "run/0")
        with pytest.raises(WriteFailed, match="does not let a writer choose sequence numbers"):
            write_batches(tank_options(options, streaming=True), [batch], task)
        report = write_batches(tank_options(options | {"exactlyOnce": "false"},
                                            streaming=True), [batch])
        assert report.counts == {0: 2}
