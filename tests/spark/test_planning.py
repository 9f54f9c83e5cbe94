"""Options, planning and pickling, without Spark running."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from gateway.client.tank import PartitionBounds
from gateway.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    Position,
    Positions,
    segment_options,
    tank_options,
)
from gateway.spark.planning import DataLossError, SequenceRange, admit, plan_batch, plan_stream
from gateway.spark.segments import FigtankSegmentsReader
from gateway.spark.sink import FigtankStreamWriter, FigtankWriter
from gateway.spark.source import FigtankDataSource, FigtankReader, FigtankStreamReader
from protocols.tank.bundle import Codec


def test_option_names_ignore_case_and_values_keep_it() -> None:
    given = {"Topic": "Orders", "startingSequence": '{"1": 17}', "MAXMESSAGESPERTRIGGER": "9",
             "endpoint": "[::1]:7000", "compression": "Snappy", "ExactlyOnce": "false",
             "commitTopicPrefix": "Copy-Job"}
    for options in (given, CaseInsensitiveDict(given)):  # what Spark hands a data source
        parsed = tank_options(options, streaming=True)
        assert parsed.topic == "Orders"
        assert parsed.starting == Positions(LATEST, {1: Position("seq", 17)})
        assert parsed.max_messages_per_trigger == 9
        assert (parsed.host, parsed.port) == ("::1", 7000)
        assert parsed.codec is Codec.SNAPPY
        assert (parsed.exactly_once, parsed.commit_topic_prefix) == (False, "Copy-Job")
    defaults = tank_options({"topic": "t"})
    assert defaults.starting == Positions(EARLIEST)
    assert (defaults.exactly_once, defaults.commit_topic_prefix) == (True, "spark-sink")


@pytest.mark.parametrize(("options", "message"), [
    ({}, "'topic' is required"),
    ({"topic": "../etc"}, "not a valid topic name"),
    ({"topic": "t", "partitions": "0,x"}, "partition numbers"),
    ({"topic": "t", "startingSequence": "soon"}, "earliest, latest or a sequence"),
    ({"topic": "t", "endingSequence": "earliest"}, "makes no sense"),
    ({"topic": "t", "startingSequence": "{"}, "bad JSON"),
    ({"topic": "t", "maxMessagesPerSplit": "0"}, "at least 1"),
    ({"topic": "t", "failOnDataLoss": "maybe"}, "true or false"),
    ({"topic": "t", "endpoint": "nowhere"}, "HOST:PORT"),
    ({"topic": "t", "exactlyOnce": "sometimes"}, "'exactlyOnce': expected true or false"),
    ({"topic": "t", "commitTopicPrefix": "-x"}, "'commitTopicPrefix': '-x' is not a valid"),
    ({"topic": "t", "commitTopicPrefix": "x" * 28}, "at most 27 characters"),
])
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        tank_options(options)


def test_segment_options_need_a_path() -> None:
    with pytest.raises(OptionError, match="data directory"):
        segment_options({"topic": "t"})
    assert segment_options({"DataDir": "/d"}).path == "/d"


def bounds(*triples: tuple[int, int, int]) -> list[PartitionBounds]:
    return [PartitionBounds(p, first, hwm) for p, first, hwm in triples]


def test_plan_batch_resolves_and_splits() -> None:
    b = bounds((0, 1, 10), (1, 5, 7), (2, 0, 0))  # partition 2 never held a message
    assert plan_batch("t", b, Positions(EARLIEST), Positions(LATEST), fail_on_data_loss=True,
                      max_messages=4) == [
        SequenceRange("t", 0, 1, 5), SequenceRange("t", 0, 5, 9), SequenceRange("t", 0, 9, 11),
        SequenceRange("t", 1, 5, 8)]
    assert plan_batch("t", b, Positions(Position("seq", 9)), Positions(Position("seq", 100)),
                      fail_on_data_loss=False, max_messages=100) == [
        SequenceRange("t", 0, 9, 11)]
    with pytest.raises(DataLossError, match="sequence 2 was removed"):
        plan_batch("t", b, Positions(Position("seq", 2)), Positions(LATEST),
                   fail_on_data_loss=True, max_messages=100)
    moved = plan_batch("t", b, Positions(Position("seq", 2)), Positions(LATEST),
                       fail_on_data_loss=False, max_messages=100)
    assert moved[1] == SequenceRange("t", 1, 5, 8)


def test_admit_shares_a_limit_fairly() -> None:
    start = {0: 1, 1: 1, 2: 1}
    available = {0: 101, 1: 4, 2: 51}  # backlogs 100, 3, 50
    assert admit(start, available, None) == available
    assert admit(start, available, 30) == {0: 1 + 13, 1: 4, 2: 1 + 14}
    assert admit(start, available, 1000) == available
    assert admit(start, available, 2) == {0: 1, 1: 2, 2: 2}
    assert admit({0: 5}, {0: 5}, 10) == {0: 5}  # nothing new


def test_plan_stream_uses_the_checkpointed_offsets() -> None:
    assert plan_stream("t", {0: 3, 1: 9}, {0: 8, 1: 9}, 3) == [
        SequenceRange("t", 0, 3, 6), SequenceRange("t", 0, 6, 8)]


def test_readers_and_writers_pickle() -> None:
    source = FigtankDataSource(CaseInsensitiveDict({"topic": "t", "endpoint": "127.0.0.1:1"}))
    for obj in (source.reader(None), source.streamReader(None), FigtankWriter(
            tank_options({"topic": "t"})), FigtankStreamWriter(tank_options({"topic": "t"})),
                FigtankSegmentsReader(segment_options({"path": "/d"}))):
        copy = pickle.loads(pickle.dumps(obj))
        assert copy.options == obj.options
    assert isinstance(source.reader(None), FigtankReader)
    assert isinstance(source.streamReader(None), FigtankStreamReader)
