"""The ``figtank-segments`` source: segment files read directly, checked against the broker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.spark.options import segment_options
from gateway.spark.segments import plan_segments, read_split
from protocols.errors import ProtocolError
from protocols.tank.bundle import Message, encode_bundle, frame_bundle
from tests.spark.helpers import BackgroundServer, Produced, expected, produce, reader, rows_of

TOPIC = "segs"


@pytest.fixture(scope="module")
def segmented(server: BackgroundServer) -> list[Produced]:
    with server.client() as client:
        client.create_topic(TOPIC, 2, {"log.segment.bytes": "4096",
                                       "log.index.interval.bytes": "256"})
    return produce(server, TOPIC, {0: 500, 1: 260}, bundle=10)


def segments(spark, data_dir: Path, **options: object):
    read = spark.read.format("figtank-segments")
    for name, value in options.items():
        read = read.option(name, str(value))
    return read.load(str(data_dir))


def segment_files(data_dir: Path) -> list[str]:
    return [name for p in (0, 1) for name in os.listdir(data_dir / TOPIC / str(p))
            if name.endswith((".log", ".ilog"))]


def test_segments_give_the_same_rows_as_the_broker(spark, server: BackgroundServer,
                                                    data_dir: Path,
                                                    segmented: list[Produced]) -> None:
    files = segment_files(data_dir)
    assert len(files) > 4  # rolled segments and the active ones
    df = segments(spark, data_dir, topic=TOPIC)
    assert df.rdd.getNumPartitions() == len(files)  # one task per segment
    broker = rows_of(reader(spark, server, TOPIC).load())
    assert broker == expected(segmented)
    assert rows_of(df) == broker
    split = segments(spark, data_dir, topic=TOPIC, maxBytesPerSplit=1024)
    assert split.rdd.getNumPartitions() > len(files)  # cut at index entries
    assert rows_of(split) == broker


def test_ranges_and_partitions_match_the_broker(spark, server: BackgroundServer,
                                                data_dir: Path,
                                                segmented: list[Produced]) -> None:
    options = {"partitions": "0", "startingSequence": 123, "endingSequence": 377}
    assert rows_of(segments(spark, data_dir, topic=TOPIC, maxBytesPerSplit=512, **options)) \
        == rows_of(reader(spark, server, TOPIC, **options).load())
    every_topic = segments(spark, data_dir, arrow="false").where(f"topic = '{TOPIC}'")
    assert rows_of(every_topic) == expected(segmented)


# ----------------------------------------------------------- the reader without Spark


def write_partition(directory: Path, name: str, bundles: list[bytes], tail: bytes = b"") -> None:
    directory.mkdir(parents=True)
    (directory / name).write_bytes(b"".join(frame_bundle(b) for b in bundles) + tail)


def read_all(data_dir: Path, **options: object) -> list[tuple[int, bytes]]:
    splits = plan_segments(segment_options({"path": str(data_dir), **options}))
    return [(m.seq, m.value) for split in splits for batch in read_split(split) for m in batch]


def test_sparse_bundles_and_a_torn_active_tail(tmp_path: Path) -> None:
    plain = encode_bundle([Message(b"a", None, 1), Message(b"b", None, 2)])
    sparse = encode_bundle([Message(b"c", None, 3, seq=10), Message(b"d", None, 4, seq=14)],
                           sparse=True)
    after = encode_bundle([Message(b"e", None, 5)])
    torn = frame_bundle(encode_bundle([Message(b"f" * 50, None, 6)]))[:-7]
    write_partition(tmp_path / "t" / "0", "5_1700000000.log", [plain, sparse, after], torn)
    assert read_all(tmp_path) == [(5, b"a"), (6, b"b"), (10, b"c"), (14, b"d"), (15, b"e")]
    assert read_all(tmp_path, startingSequence=6, endingSequence=15) == [
        (6, b"b"), (10, b"c"), (14, b"d")]


def test_a_torn_rolled_segment_is_an_error(tmp_path: Path) -> None:
    bundle = encode_bundle([Message(b"x", None, 1)])
    write_partition(tmp_path / "t" / "0", "1-2_1700000000.ilog", [bundle],
                    frame_bundle(bundle)[:-1])
    with pytest.raises(ProtocolError, match="partial bundle"):
        read_all(tmp_path)
