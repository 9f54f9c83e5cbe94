"""The group coordinator's own memory and log lines under request floods: its timer
heap does not keep entries for members and joins long gone, and a limit's warning is
logged once a minute, not once per refused request."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from gateway.core.metrics import Metrics
from gateway.kafka.groups.coordinator import GroupCoordinator, JoinRequest
from gateway.kafka.groups.settings import GroupSettings
from protocols.kafka.types import ErrorCode


def _join(group: str, member_id: str = "", session_ms: int = 1_800_000) -> JoinRequest:
    return JoinRequest(group_id=group, member_id=member_id, instance_id=None,
                       protocol_type="consumer", protocols=[("range", b"m")],
                       session_timeout_ms=session_ms, rebalance_timeout_ms=session_ms,
                       require_known_member_id=True, client_id="c", client_host="h")


async def test_join_and_leave_loops_do_not_grow_the_timer_heap():
    coordinator = GroupCoordinator(GroupSettings(), Metrics())
    async with trio.open_nursery() as nursery:
        await nursery.start(coordinator.run)
        for i in range(3000):
            # A member id handed out (its lapse: the 30-minute session timeout), then
            # given back at once.
            answer = await coordinator.join(_join(f"g{i % 7}"))
            assert answer.error == ErrorCode.MEMBER_ID_REQUIRED
            assert coordinator.leave(f"g{i % 7}", [(answer.member_id, None)]) == [0]
        assert len(coordinator._timers) <= 256  # the floor below which it is not pruned
        nursery.cancel_scope.cancel()


async def test_a_group_limit_is_logged_once_a_minute():
    coordinator = GroupCoordinator(GroupSettings(max_members=2), Metrics())
    async with trio.open_nursery() as nursery:
        await nursery.start(coordinator.run)
        with capture_logs() as logs:
            for _ in range(50):
                answer = await coordinator.join(_join("g"))
                assert answer.error in (ErrorCode.MEMBER_ID_REQUIRED,
                                        ErrorCode.GROUP_MAX_SIZE_REACHED)
        assert len([e for e in logs if e["event"] == "kafka_group_limit_reached"]) == 1
        nursery.cancel_scope.cancel()
