"""The generated record modules: current with the declarations, picklable, typed."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest

from protocols import generate
from protocols.figg import messages as figg
from protocols.figg import records as figg_records
from protocols.tank import messages as tank
from protocols.tank import records as tank_records
from protocols.tank.types import ProduceTopicResult


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    assert generate.main(["--out", str(tmp_path)]) == 0
    for target in generate.targets():
        written = (tmp_path / target.path).read_text(encoding="utf-8")
        checked_in = (generate.ROOT / target.path).read_text(encoding="utf-8")
        assert written == checked_in, (
            f"{target.path} is out of date: run {generate.COMMAND}")


def test_check_reports_a_stale_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    generate.main(["--out", str(tmp_path)])
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    stale = tmp_path / generate.targets()[0].path
    stale.write_text(stale.read_text() + "# edited by hand\n")
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    assert "edited by hand" in capsys.readouterr().out


SAMPLES: list[Any] = [
    figg.Publish("orders", 7, b"\x00payload"),
    figg.Attach(figg.ATTACH_FROM_OFFSET, "orders", 12),
    figg.Ping(99),
    tank.ProduceRequest(2, 1, "cli", 1, 500, [
        tank.ProduceTopic("orders", [tank.ProducePartition(0, b"bundle")])]),
    tank.ConsumeRequest(3, 2, "cli", 100, 1, 0, [
        tank.ConsumeTopic("orders", [tank.ConsumePartition(0, 5, 4096)])]),
    tank.ProduceResponse(1, [ProduceTopicResult("orders", [])]),
    tank.Ping(),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_records_pickle_round_trip(record: Any) -> None:
    assert pickle.loads(pickle.dumps(record)) == record


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_records_name_their_real_module(record: Any) -> None:
    module = type(record).__module__
    assert module in (figg_records.__name__, tank_records.__name__)
    assert getattr(__import__(module, fromlist=["_"]), type(record).__name__) is type(record)


def test_records_are_frozen_and_typed() -> None:
    record = figg.Publish("orders", 7, b"x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.seq_num = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del record.topic
    assert figg.Publish.__match_args__ == ("topic", "seq_num", "data")
    assert figg.Publish.__annotations__ == {"topic": "str", "seq_num": "int", "data": "bytes"}
    assert figg.Publish.__doc__ is not None and "PUBLISH" in figg.Publish.__doc__


@pytest.mark.parametrize("codecs", [figg.CODECS, tank.CODECS], ids=["figg", "tank"])
def test_decoded_records_are_the_record_classes(codecs: dict[str, Any]) -> None:
    """Decoders build records without the frozen __init__: they must still be exact."""
    for sample in SAMPLES:
        codec = codecs.get(type(sample).__name__)
        if codec is None or codec.record is not type(sample) or isinstance(
                sample, tank.ProduceResponse):  # that one decodes with its request
            continue
        decoded = codec.decode(codec.encode(sample))
        assert type(decoded) is type(sample)
        assert decoded == sample
        assert pickle.loads(pickle.dumps(decoded)) == sample
        if not any(isinstance(getattr(sample, name), list) for name in sample.__match_args__):
            assert hash(decoded) == hash(sample)


def test_records_compare_print_and_replace_by_their_fields() -> None:
    from protocols.kafka import records as kafka
    from protocols.record import replace

    record = kafka.ApiVersion(18, 0, 3)
    assert record == kafka.ApiVersion(api_key=18, min_version=0, max_version=3)
    assert record != kafka.ApiVersion(18, 0, 4)
    assert record != figg.Ping(18)  # another class: never equal
    assert repr(record) == "ApiVersion(api_key=18, min_version=0, max_version=3)"
    assert hash(record) == hash(kafka.ApiVersion(18, 0, 3))
    assert pickle.loads(pickle.dumps(record)) == record
    changed = replace(record, max_version=4)
    assert (changed, record) == (kafka.ApiVersion(18, 0, 4), kafka.ApiVersion(18, 0, 3))
    with pytest.raises(TypeError, match="no field"):
        replace(record, max=4)


def test_records_get_a_new_list_or_struct_for_each_default() -> None:
    from protocols.kafka import records as kafka

    first, second = kafka.ApiVersionsResponse(), kafka.ApiVersionsResponse()
    assert first.api_keys == [] and first.api_keys is not second.api_keys
    partition = kafka.PartitionData()
    assert partition.current_leader == kafka.LeaderIdAndEpoch()
    assert partition.current_leader is not kafka.PartitionData().current_leader
    # A nullable list defaulting to empty still takes null.
    assert kafka.MetadataRequest().topics == []
    assert kafka.MetadataRequest(None).topics is None
