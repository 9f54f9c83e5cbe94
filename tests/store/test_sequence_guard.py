"""The sequence-space guard: no produce may leave a partition unable to take the next one."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from gateway.store import InvalidSequence
from gateway.store.partition import MAX_CHOSEN_SEQ
from tests.store.helpers import all_messages, bundle, sparse_bundle, store_at

U64 = 1 << 64


@pytest.mark.parametrize("how", ["sparse", "base_seq", "sparse_past_int64"])
async def test_a_produce_near_the_end_of_the_sequence_space_is_refused(tmp_path, how):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        await p.append(bundle(2))
        size = p.size_bytes
        with capture_logs() as logs, pytest.raises(InvalidSequence):
            if how == "sparse":
                await p.append(sparse_bundle([U64 - 3, U64 - 2]))
            elif how == "base_seq":
                await p.append(bundle(2), base_seq=U64 - 3)
            else:
                await p.append(sparse_bundle([MAX_CHOSEN_SEQ, MAX_CHOSEN_SEQ + 1]))
        (event,) = [e for e in logs if e["event"] == "produce_sequence_refused"]
        assert event["max_seq"] == MAX_CHOSEN_SEQ
        assert (p.high_water_mark, p.size_bytes) == (2, size)  # nothing appended
        r = await p.append(bundle(1, "next"))
        assert (r.first_seq, r.last_seq) == (3, 3)
    async with store_at(tmp_path) as store:  # and after a restart
        p = store.partition("t", 0)
        r = await p.append(bundle(1, "again"))
        assert r.first_seq == 4
        assert [m.seq for m in all_messages(p)] == [1, 2, 3, 4]


async def test_the_largest_chosen_sequence_leaves_room_for_every_later_produce(tmp_path):
    async with store_at(tmp_path) as store:
        await store.create_topic("t", 1)
        p = store.partition("t", 0)
        r = await p.append(sparse_bundle([MAX_CHOSEN_SEQ - 1, MAX_CHOSEN_SEQ]))
        assert r.last_seq == MAX_CHOSEN_SEQ
        for _ in range(3):
            r = await p.append(bundle(2))
        assert r.last_seq == MAX_CHOSEN_SEQ + 6
    async with store_at(tmp_path) as store:
        p = store.partition("t", 0)
        r = await p.append(bundle(1))
        assert r.first_seq == MAX_CHOSEN_SEQ + 7
        assert [m.seq for m in all_messages(p)][:3] == [MAX_CHOSEN_SEQ - 1, MAX_CHOSEN_SEQ,
                                                         MAX_CHOSEN_SEQ + 1]
