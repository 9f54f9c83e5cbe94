"""A connection's view of the policy: cached answers dropped on reload, refusals counted
every time and logged at most once per topic and operation, at most LOGGED_REFUSALS lines."""

from __future__ import annotations

import structlog
from structlog.testing import capture_logs

from gateway.auth.guard import LOGGED_REFUSALS, AccessGuard
from gateway.auth.policy import Operation, Policy, parse_policy
from gateway.auth.principal import Principal
from gateway.core.metrics import Metrics


def deny_all() -> Policy:
    return parse_policy({"default": "deny"})


def test_answers_follow_a_reload_and_no_policy_allows_everything() -> None:
    guard = AccessGuard()
    access = guard.connection(Principal("tank"), structlog.get_logger())
    assert access.open and access.may("t", Operation.PUBLISH)
    guard.replace(deny_all())
    assert not access.open and not access.may("t", Operation.PUBLISH)
    guard.replace(parse_policy({}))
    assert access.may("t", Operation.PUBLISH)


def test_refusals_are_counted_always_and_logged_with_a_bound() -> None:
    metrics = Metrics()
    guard = AccessGuard(deny_all(), metrics)
    access = guard.connection(Principal("tank"), structlog.get_logger())
    with capture_logs() as logs:
        for _ in range(3):
            access.refused("same", Operation.PUBLISH, "produce", "read-only (0xfe)")
        for i in range(LOGGED_REFUSALS * 2):
            access.refused(f"t{i}", Operation.SUBSCRIBE, "consume", "unknown topic")
    events = [e["event"] for e in logs]
    assert events.count("access_denied") == LOGGED_REFUSALS
    assert events.count("access_denied_logging_suppressed") == 1
    text = metrics.render().decode()
    assert 'figtank_access_denied_total{listener="tank",operation="publish"} 3.0' in text
    assert (f'figtank_access_denied_total{{listener="tank",operation="subscribe"}} '
            f'{LOGGED_REFUSALS * 2}.0') in text
    # a reload starts the logging over
    guard.replace(deny_all())
    with capture_logs() as logs:
        access.may("same", Operation.PUBLISH)
        access.refused("same", Operation.PUBLISH, "produce", "read-only (0xfe)")
    assert [e["event"] for e in logs] == ["access_denied"]
