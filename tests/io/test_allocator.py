"""keep_large_buffers: large buffers built and dropped again and again come from the heap,
not fresh pages (counted as the process's minor page faults, in a process of their own)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.io.allocator import keep_large_buffers

# Buffers of 256 KiB to 2 MiB made and dropped in an order that leaves glibc's own adaptive
# thresholds behind (as a produce's decompressed set, batch and compressed copy do).
_CHURN = """
import resource, sys
from gateway.io.allocator import keep_large_buffers
tuned = keep_large_buffers(int(sys.argv[1]))
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for _ in range(50):
    a = b"x" * (256 << 10)
    b = a * 3
    c = b + a
    del a, b
    d = c * 2
    del c, d
print(tuned, faults() - before)
"""


def _churn(keep_bytes: int) -> tuple[bool, int]:
    done = subprocess.run([sys.executable, "-c", _CHURN, str(keep_bytes)],
                          capture_output=True, text=True, timeout=60, check=True)
    tuned, faults = done.stdout.split()
    return tuned == "True", int(faults)


def test_large_buffers_are_reused_instead_of_faulted_in_again() -> None:
    tuned, faults = _churn(32 << 20)
    untuned, faults_before = _churn(0)
    assert tuned and not untuned
    # 50 rounds of 4 MiB written: ~50,000 faults without; with, about the first round's.
    assert faults_before > 25_000
    assert faults < faults_before // 10


def test_a_negative_keep_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        keep_large_buffers(-1)
