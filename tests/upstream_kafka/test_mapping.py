"""The upstream's refusals mapped to what the front ends answer (sans-IO): a produce's
outcome (Tank code, reason, Kafka code) and a read's fetch status, by Kafka's error name."""

from __future__ import annotations

import pytest

from gateway.backend.kafka.backend import read_refusal
from gateway.backend.kafka.produce import refused_outcome
from gateway.core.contract import FetchStatus, ProduceCode
from protocols.kafka.types import ErrorCode


@pytest.mark.parametrize(("name", "code", "kafka", "says"), [
    ("MESSAGE_TOO_LARGE", ProduceCode.IO_FAULT, ErrorCode.MESSAGE_TOO_LARGE,
     "message too large for the upstream"),
    ("RECORD_LIST_TOO_LARGE", ProduceCode.IO_FAULT, ErrorCode.MESSAGE_TOO_LARGE,
     "message too large for the upstream"),
    ("TOPIC_AUTHORIZATION_FAILED", ProduceCode.READ_ONLY, 0, "upstream authorization failed"),
    ("UNKNOWN_TOPIC_OR_PARTITION", ProduceCode.UNKNOWN_TOPIC, 0, "upstream: "),
    ("TIMED_OUT", ProduceCode.IO_FAULT, 0, "the upstream did not acknowledge in time"),
    ("NOT_ENOUGH_REPLICAS", ProduceCode.IO_FAULT, 0, "upstream: "),
])
def test_a_refused_produce(name: str, code: ProduceCode, kafka: int, says: str) -> None:
    outcome = refused_outcome(name, "the cluster's text")
    assert (outcome.code, outcome.kafka_error) == (code, kafka)
    assert outcome.reason.startswith(says) and outcome.reason.endswith("the cluster's text")


@pytest.mark.parametrize(("name", "status"), [
    ("TOPIC_AUTHORIZATION_FAILED", FetchStatus.DENIED),
    ("CLUSTER_AUTHORIZATION_FAILED", FetchStatus.DENIED),
    ("UNKNOWN_TOPIC_OR_PARTITION", FetchStatus.UNKNOWN_TOPIC),
    ("NETWORK_EXCEPTION", FetchStatus.FAULT),  # an outage: readers retry
    ("NOT_LEADER_OR_FOLLOWER", FetchStatus.FAULT),
])
def test_a_refused_read(name: str, status: FetchStatus) -> None:
    assert read_refusal(name) is status
