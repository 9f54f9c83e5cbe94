"""The one reconnect backoff, and the names it keeps."""

from __future__ import annotations

import gateway.client.figg
from gateway.backend.bridge.upstream import Backoff as BridgeBackoff
from gateway.io.backoff import ExponentialBackoff


def test_the_first_redial_is_immediate_then_it_doubles_up_to_the_cap() -> None:
    backoff = ExponentialBackoff(base=1.0, cap=30.0, rng=lambda: 0.5)  # jitter factor 1
    assert [backoff(n) for n in range(8)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff(-1) == 0.0
    assert backoff(10**9) == 30.0  # no overflow


def test_the_jitter_stays_in_its_range() -> None:
    low = ExponentialBackoff(rng=lambda: 0.0)
    high = ExponentialBackoff(rng=lambda: 0.9999)
    assert low(3) == 4.0 * 0.8
    assert 4.0 * 1.19 < high(3) < 4.0 * 1.2
    assert ExponentialBackoff(jitter=(1.0, 1.0))(2) == 2.0


def test_the_public_names_are_the_one_class() -> None:
    assert gateway.client.figg.ExponentialBackoff is ExponentialBackoff
    bridge = BridgeBackoff(rng=lambda: 0.5)
    assert isinstance(bridge, ExponentialBackoff)
    assert [bridge(n) for n in range(3)] == [0.0, 0.1, 0.2]
    assert bridge(100) == 5.0
