"""What the store shares with each of its partitions (:class:`PartitionEnv`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from gateway.store.disk import DiskGuard
from gateway.store.durability import Durability
from gateway.store.files import OpenFiles
from gateway.store.producers import ProducerBudget
from gateway.store.syncer import NativeSyncer, Syncer
from gateway.store.tail import TailCache


@dataclass(frozen=True, slots=True)
class PartitionEnv:
    """What the store shares with its partitions."""

    durability: Durability
    max_bundle_size: int
    recovery_check_bytes: int
    #: Starts a background task in the store's nursery.
    spawn: Callable[..., Any]
    limiter: trio.CapacityLimiter
    #: Bounds the damage checks of rolled segments running in worker threads (their own
    #: limiter: a long check must not hold up topic creation or the final fsyncs).
    check_limiter: trio.CapacityLimiter
    #: Runs the fsyncs.
    syncer: Syncer | NativeSyncer
    #: Wall-clock seconds (segment names, retention, rolling by age).
    clock: Callable[[], float]
    #: Called with the seconds each group fsync took (metrics).
    observe_fsync: Callable[[float], None] | None = None
    #: Keeps the newest bundles in memory for the readers at the tail (None: off).
    tail: TailCache | None = None
    #: Bounds the rolled segment files open at once (None: no bound).
    files: OpenFiles | None = None
    #: When rolled segments are checked for damage: "lazy" (first read) or "startup".
    check_rolled: str = "lazy"
    #: A lazy check of a rolled segment up to this size runs at once, in the reader's
    #: call; a bigger one in a worker thread while the reader waits (SegmentCheckPending).
    inline_check_bytes: int = 64 * 1024
    #: Called with ``(messages, bytes)`` each time damage or a recovery cut loses data.
    on_data_loss: Callable[[int, int], None] | None = None
    #: The bound on idempotent producers remembered by all partitions together.
    producers: ProducerBudget | None = None
    #: The data directory's disk: free space, its floor, prefill, faults (None: unwatched).
    disk: DiskGuard | None = None
