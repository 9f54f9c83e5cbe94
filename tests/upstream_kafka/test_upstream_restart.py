"""The upstream killed with SIGKILL and restarted (same ports, same data directory) while
Figg publishers (sliding window), Tank producers and a Kafka client (confluent-kafka, through
the gateway's Kafka listener) produce through a gateway in upstream-Kafka mode: every
message a client saw acknowledged is in the upstream exactly once, in each publisher's
order; a message stored but never acknowledged is allowed (counted), never twice."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import confluent_kafka as ck
import trio

from gateway.client.errors import ClientError
from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.bridge.helpers import metric
from tests.serving import Served
from tests.upstream_kafka.helpers import Upstream, gateway, kafka_address

FIGG_PUBLISHERS = 3
TANK_PRODUCERS = 2
#: Each publisher stops at this many messages (or when told to stop, sooner).
MAX_MESSAGES = 4000
#: How long the load runs before the kill, and after the upstream is back.
BEFORE_KILL_SECS = 1.5
AFTER_RESTART_SECS = 1.5


class Ledger:
    """What each publisher sent (in order) and what it saw acknowledged."""

    def __init__(self) -> None:
        self.sent: dict[str, list[bytes]] = {}
        self.acked: set[bytes] = set()
        self.failed = 0
        self._lock = threading.Lock()  # the Kafka client's callbacks run in a thread

    def sending(self, publisher: str, value: bytes) -> None:
        with self._lock:
            self.sent.setdefault(publisher, []).append(value)

    def ack(self, value: bytes) -> None:
        with self._lock:
            self.acked.add(value)


async def figg_publisher(address: tuple[str, int], name: str, ledger: Ledger,
                         stop: trio.Event) -> None:
    async with open_figg_client(*address, window=64) as client:
        try:
            for i in range(MAX_MESSAGES):
                if stop.is_set():
                    break
                value = b"%s-%05d" % (name.encode(), i)
                ledger.sending(name, value)
                await client.publish("figg-load", value,
                                     on_ack=lambda _, v=value: ledger.ack(v))
            await client.wait_all_acked()
        except ClientError:
            ledger.failed += 1


async def tank_producer(address: tuple[str, int], name: str, partition: int, ledger: Ledger,
                        stop: trio.Event) -> None:
    async with open_tank_client(*address, request_timeout=30) as tank:
        for i in range(0, MAX_MESSAGES, 4):
            if stop.is_set():
                break
            values = [b"%s-%05d" % (name.encode(), i + j) for j in range(4)]
            for value in values:
                ledger.sending(name, value)
            try:
                await tank.produce({("tank-load", partition): values})
            except ClientError:
                ledger.failed += 1  # not acknowledged: never sent again (no duplicate)
                continue
            for value in values:
                ledger.ack(value)


def kafka_producer(bootstrap: str, ledger: Ledger, stop: threading.Event) -> None:
    """An idempotent confluent-kafka producer through the gateway's Kafka listener."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "linger.ms": 5, "message.timeout.ms": 30_000,
                            "socket.timeout.ms": 30_000})

    def delivered(error: ck.KafkaError | None, message: ck.Message) -> None:
        if error is None:
            ledger.ack(message.value())
        else:
            ledger.failed += 1

    for i in range(MAX_MESSAGES):
        if stop.is_set():
            break
        partition = i % 2
        value = b"kafka-p%d-%05d" % (partition, i)
        ledger.sending(f"kafka-p{partition}", value)
        while True:
            try:
                producer.produce("kafka-load", value, partition=partition,
                                 on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if i % 50 == 49:
            stop.wait(0.005)  # a steady stream, not one burst
    assert producer.flush(40) == 0, "the Kafka client still holds messages"


def check(ledger: Ledger, stored: list[bytes]) -> tuple[int, int, int]:
    """Lost (acknowledged, not stored), duplicated (stored more than once) and stored
    without an acknowledgement; asserts each publisher's order."""
    counts = Counter(stored)
    lost = sum(1 for value in ledger.acked if counts[value] == 0)
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    unacked_present = sum(1 for value in counts if value not in ledger.acked)
    position = {value: i for i, value in enumerate(stored)}
    for publisher, values in ledger.sent.items():
        where = [position[v] for v in values if v in position]
        assert where == sorted(where), f"{publisher}'s messages are stored out of order"
    return lost, duplicated, unacked_present


async def test_sigkill_and_restart_of_the_upstream_under_load(tmp_path: Path) -> None:
    upstream = Upstream(tmp_path / "up")
    # The restart must come within the gateway producer's delivery timeout: a loaded test
    # machine may take several seconds to start the upstream again, so give it 30.
    config = tmp_path / "gateway.toml"
    config.write_text('[upstream_kafka]\ndelivery_timeout_secs = 30\n')
    front = gateway(upstream.address, "--config", str(config))
    again: Served | None = None
    ledger = Ledger()
    stop, kafka_stop = trio.Event(), threading.Event()
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            served = await front.start()
            assert served.figg and served.tank and served.kafka
            async with open_tank_client("127.0.0.1", upstream.tank_port) as tank:
                await tank.create_topic("figg-load", 1)
                await tank.create_topic("tank-load", TANK_PRODUCERS)
                await tank.create_topic("kafka-load", 2)
            async with trio.open_nursery() as load:
                for n in range(FIGG_PUBLISHERS):
                    load.start_soon(figg_publisher, served.figg, f"figg{n}", ledger, stop)
                for n in range(TANK_PRODUCERS):
                    load.start_soon(tank_producer, served.tank, f"tank{n}", n, ledger, stop)
                load.start_soon(trio.to_thread.run_sync, kafka_producer,
                                kafka_address(served), ledger, kafka_stop)
                try:
                    await trio.sleep(BEFORE_KILL_SECS)
                    acked_before = len(ledger.acked)
                    await upstream.served.kill()
                    killed_at = trio.current_time()
                    again = Served(*upstream.served.args, "--metrics-listen", "127.0.0.1:0")
                    restarted = await again.start()
                    restarted_after = trio.current_time() - killed_at
                    await trio.sleep(AFTER_RESTART_SECS)
                finally:  # also when the test fails: the Kafka client's thread stops too
                    stop.set()
                    kafka_stop.set()
            stored: dict[str, list[bytes]] = {}
            for topic, partitions in [("figg-load", 1), ("tank-load", TANK_PRODUCERS),
                                      ("kafka-load", 2)]:
                for p in range(partitions):
                    stored[f"{topic}/{p}"] = [v for _, v in await upstream.stored(topic, p)]
            assert restarted.metrics
            recognised = metric(restarted.metrics,
                                'figtank_kafka_producer_retries_total{known_from="stored"}')
    finally:
        front.close()
        upstream.served.close()
        if again is not None:
            again.close()
    every = [value for values in stored.values() for value in values]
    lost, duplicated, unacked_present = check(ledger, every)
    print(f"upstream restart: acked={len(ledger.acked)} acked_before_kill={acked_before} "
          f"stored={len(every)} lost={lost} duplicated={duplicated} "
          f"unacked_present={unacked_present} failed={ledger.failed} "
          f"retries_recognised_after_restart={recognised or 0:.0f} "
          f"restarted_after={restarted_after:.2f}s")
    assert acked_before > 0 and len(ledger.acked) > acked_before  # load on both sides
    # Every partition got messages.
    assert all(stored[key] for key in stored), {k: len(v) for k, v in stored.items()}
    assert (lost, duplicated) == (0, 0)
