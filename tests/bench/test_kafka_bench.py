"""The kafka-produce and kafka-consume scenarios at a tiny size, with confluent-kafka
against a ``figtank serve`` whose Kafka listener is on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.bench.command import BenchError, bench
from gateway.bench.serving import Served, serve_figtank
from gateway.cli.main import main
from tests.bench.test_scenarios import check_report


@pytest.fixture(scope="module")
def kafka_figtank() -> Iterator[Served]:
    with serve_figtank("--kafka-listen", "127.0.0.1:0", durability="os") as served:
        yield served


@pytest.fixture
def endpoints(kafka_figtank: Served) -> list[str]:
    assert kafka_figtank.kafka
    return ["--tank", kafka_figtank.tank, "--kafka", kafka_figtank.kafka,
            "--target", "figtank-test", "--server-pid", str(kafka_figtank.process.pid),
            "--timeout", "60"]


def test_kafka_produce(endpoints: list[str]) -> None:
    report = bench(["kafka-produce", "--messages", "3000", "--size", "120", *endpoints])
    check_report(report, "kafka-produce", 1)
    [row] = report.rows
    assert (row.messages, row.payload_bytes) == (3000, 3000 * 120)
    assert row.latency_of == "delivery" and row.latency is not None
    assert row.latency["count"] == 3000  # one delivery report per message
    [check] = report.checks
    assert (check.expected, check.received) == (3000, 3000)  # by the end offsets
    assert report.params["end_before"] == 0


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_kafka_produce_compressed_over_two_processes(endpoints: list[str], codec: str
                                                    ) -> None:
    report = bench(["kafka-produce", "--messages", "2001", "--procs", "2", "--compressible",
                    "--compression", codec, "--linger-ms", "1", *endpoints])
    check_report(report, "kafka-produce", 1)
    assert report.generator["procs"] == 2
    assert report.checks[0].received == 2001


def test_kafka_produce_into_a_topic_that_has_messages(endpoints: list[str]) -> None:
    first = bench(["kafka-produce", "--messages", "500", *endpoints])
    again = bench(["kafka-produce", "--messages", "700", "--topic", first.params["topic"],
                   *endpoints])
    check_report(again, "kafka-produce", 1)
    assert again.params["end_before"] == 500
    assert (again.checks[0].expected, again.checks[0].received) == (700, 700)


def test_kafka_consume(endpoints: list[str]) -> None:
    report = bench(["kafka-consume", "--messages", "2500", "--size", "300",
                    "--fetch-size", "65536", "--procs", "2", *endpoints])
    check_report(report, "kafka-consume", 1)
    [row] = report.rows
    assert (row.messages, row.payload_bytes) == (2500, 2500 * 300)
    assert (report.params["first_offset"], report.params["end_offset"]) == (0, 2500)
    assert report.checks[0].duplicates == 0


def test_kafka_consume_of_snappy_batches(endpoints: list[str]) -> None:
    report = bench(["kafka-consume", "--messages", "1000", "--compression", "snappy",
                    "--compressible", *endpoints])
    check_report(report, "kafka-consume", 1)
    assert report.rows[0].messages == 1000


def test_an_unreachable_kafka_endpoint_fails_the_run(kafka_figtank: Served, capsys) -> None:
    code = main(["bench", "kafka-produce", "--tank", kafka_figtank.tank,
                 "--kafka", "127.0.0.1:1", "--messages", "10", "--timeout", "5"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "figtank bench:" in err


def test_kafka_options_are_checked() -> None:
    with pytest.raises(BenchError, match="TLS"):
        bench(["kafka-produce", "--tls"])
    with pytest.raises(BenchError, match="--batch-bytes"):
        bench(["kafka-produce", "--batch-bytes", "0"])
