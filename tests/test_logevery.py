"""LogEvery: one line per key per interval, and the count of those held back."""

from __future__ import annotations

import time

from gateway.logevery import LogEvery


def test_one_line_per_key_per_interval_with_the_count_held_back() -> None:
    every = LogEvery(interval=0.2)
    assert every.due("a") == 0  # the first is logged
    assert [every.due("a") for _ in range(3)] == [None, None, None]  # held back
    assert every.due("b") == 0  # another key has its own clock
    time.sleep(0.25)
    assert every.due("a") == 3  # logged again, saying how many were held back
    assert every.due("a") is None
