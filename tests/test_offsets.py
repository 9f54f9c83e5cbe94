"""Figg <-> Tank topic and offset mapping."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.figg.offsets import InvalidTopic, attach_start, figg_to_tank, tank_to_figg
from protocols.figg.messages import ATTACH_FROM_OFFSET
from protocols.topics import is_valid_topic_name

RESUME = ATTACH_FROM_OFFSET


@pytest.mark.parametrize(("figg", "topic", "partition"), [
    ("orders", "orders", 0), ("orders/0", "orders", 0), ("orders/3", "orders", 3),
    ("a", "a", 0), ("a-b_c9/65529", "a-b_c9", 65529),
])
def test_topic_mapping(figg: str, topic: str, partition: int) -> None:
    mapped = figg_to_tank(figg)
    assert (mapped.topic, mapped.partition) == (topic, partition)
    assert figg_to_tank(tank_to_figg(topic, partition)) == mapped


@pytest.mark.parametrize("figg", [
    "", "/1", "orders/", "orders/x", "orders/-1", "orders/01", "orders/65530", "orders/1/2",
    "../etc", "a/../b", "-lead", "trail_", "has space", "dot.ted", "x" * 65, "nul\0",
    "orders/٣",
])
def test_invalid_topics_are_refused(figg: str) -> None:
    with pytest.raises(InvalidTopic):
        figg_to_tank(figg)


def test_name_rule_edges() -> None:
    assert is_valid_topic_name("x" * 64)
    assert not is_valid_topic_name("x" * 65)
    assert is_valid_topic_name("a_b-c")
    assert not is_valid_topic_name("_a")
    assert not is_valid_topic_name("a-")


# Partition with messages 5..20 available (earlier ones expired by retention).
FIRST, HWM = 5, 20


@pytest.mark.parametrize(("flags", "offset", "first_seq"), [
    (0, 0, 21),            # no flag: live only, after the high-water mark
    (0, 7, 21),            # no flag: the offset is ignored
    (RESUME, 0, 5),        # from the beginning
    (RESUME, 9, 10),       # resume after 9
    (RESUME, 19, 20),
    (RESUME, 20, 21),      # resume after the last message: wait for the next
    (RESUME, 21, 21),      # one past the end: clamped to the tail
    (RESUME, 10**9, 21),   # far future: clamped to the tail
    (RESUME, 2, 5),        # expired: clamped to the first available
    (RESUME, 4, 5),
])
def test_attach_rules(flags: int, offset: int, first_seq: int) -> None:
    start = attach_start(flags, offset, FIRST, HWM)
    assert start.first_seq == first_seq
    assert start.attached_offset == first_seq - 1


def test_attach_on_empty_partition() -> None:
    # An empty partition: first available is hwm + 1 (= 1 for a new one).
    assert attach_start(RESUME, 0, 1, 0).first_seq == 1
    assert attach_start(0, 0, 1, 0).first_seq == 1
    assert attach_start(RESUME, 50, 1, 0).first_seq == 1
    # Tank's report for a partition that never held a message: (0, 0).
    assert attach_start(RESUME, 0, 0, 0).first_seq == 1
    assert attach_start(0, 0, 0, 0).first_seq == 1


@given(flags=st.sampled_from([0, RESUME]), offset=st.integers(0, 2**64 - 1),
       first=st.integers(1, 1000), length=st.integers(0, 1000))
def test_attach_always_within_bounds(flags: int, offset: int, first: int, length: int) -> None:
    hwm = first - 1 + length
    start = attach_start(flags, offset, first, hwm)
    assert first <= start.first_seq <= hwm + 1
    if flags and offset > 0 and first <= offset + 1 <= hwm + 1:
        assert start.first_seq == offset + 1
