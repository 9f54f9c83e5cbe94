"""The process's file descriptors: how many are open, the limit, and what a data directory
needs.

Every partition holds two descriptors once written to (its active segment and that
segment's index); rolled segments hold one each while open, within the store's
``max_open_segments``; a read in flight shares its segment's. :func:`needed_at_start` says
what a data directory needs, :func:`raise_soft_limit` raises ``RLIMIT_NOFILE`` towards a
target, and :class:`DescriptorBudget` refuses a topic creation that would leave fewer than
a reserve of descriptors free, so creating topics can never drive the process into EMFILE.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gateway.store.names import is_valid_topic_name

#: Descriptors one partition holds (active segment and its index).
PER_PARTITION: Final = 2
#: Descriptors the process needs besides the partitions' and the connections': listening
#: sockets, logs, the fsync workers' pipes, directories being synced, the interpreter's.
BASE_RESERVE: Final = 64
#: While the last count leaves more than this free beyond what is asked, a creation within
#: a second of it is not counted again (a count lists ``/proc/self/fd``).
_SLACK: Final = 1024
_RECOUNT_SECS: Final = 1.0


def open_descriptors() -> int | None:
    """Descriptors this process has open now; None where ``/proc/self/fd`` is missing."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        return None


def descriptor_limits() -> tuple[int, int]:
    """``(soft, hard)`` RLIMIT_NOFILE, with "unlimited" as a large number."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    return (1 << 30 if soft == unlimited else soft, 1 << 30 if hard == unlimited else hard)


def count_partitions(data_dir: str | os.PathLike[str]) -> int:
    """Partitions the store will load from ``data_dir`` (0 when it does not exist)."""
    total = 0
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        path = os.path.join(data_dir, name)
        if not is_valid_topic_name(name) or not os.path.isdir(path):
            continue
        ids = [int(e) for e in os.listdir(path) if e.isdigit()]
        total += max(ids) + 1 if ids else 0
    return total


@dataclass(frozen=True, slots=True)
class DescriptorPlan:
    """What the process needs, wants, and the limits it found."""

    partitions: int
    #: Descriptors the data directory needs: ``2 x partitions + BASE_RESERVE``.
    required: int
    #: What the soft limit is raised to.
    target: int
    soft: int
    hard: int


def needed_at_start(partitions: int, *, max_open_segments: int, connections: int,
                    open_files: int = 0) -> DescriptorPlan:
    """The plan for a store of ``partitions`` partitions.

    Required: 2 per partition + :data:`BASE_RESERVE`. Wanted on top: ``max_open_segments``
    rolled segment files and ``connections`` client connections. The target is
    ``open_files`` when set, else the wanted total capped at the hard limit (never below
    the soft limit the process has already).
    """
    soft, hard = descriptor_limits()
    required = PER_PARTITION * partitions + BASE_RESERVE
    wanted = required + max_open_segments + connections
    target = open_files or max(soft, min(hard, wanted))
    return DescriptorPlan(partitions, required, target, soft, hard)


def raise_soft_limit(target: int) -> None:
    """Set the soft RLIMIT_NOFILE to ``target`` (at most the hard limit); raises
    ``ValueError`` / ``OSError`` when the system refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class DescriptorBudget:
    """Whether the process has descriptors left for more partitions, keeping ``reserve``
    free (0: no check). Counts the open descriptors at most once a second while far from
    the limit, at every check near it. A partition opens its files at its first append, so
    the partitions that have not yet (``unopened()``) count as if they had."""

    def __init__(self, reserve: int, clock: Callable[[], float] = time.monotonic, *,
                 allowance: int = 0, may_raise: bool = False) -> None:
        self.reserve = reserve
        #: Kept free too (rolled segment files, connections), up to half the limit.
        self.allowance = allowance
        #: Raise the soft limit towards the hard one before refusing.
        self.may_raise = may_raise
        self._clock = clock
        #: Descriptors open or promised at the last count, plus those promised since.
        self._counted: int | None = None
        self._counted_at = 0.0

    def kept_free(self, limit: int | None = None) -> int:
        """Descriptors a creation leaves free: the reserve, plus the allowance for
        connections and segment files up to half of ``limit`` (default: the soft limit)."""
        if limit is None:
            limit = descriptor_limits()[0]
        return self.reserve + min(self.allowance, limit // 2)

    def room_for(self, partitions: int, unopened: Callable[[], int]
                 ) -> tuple[bool, int, int]:
        """``(fits, free, needed)`` for ``partitions`` new partitions; when they fit, the
        descriptors they will take are counted as taken."""
        if self.reserve <= 0:
            return True, 0, 0
        needed = PER_PARTITION * partitions
        limit, hard = descriptor_limits()
        now = self._clock()
        counted = self._counted
        if (counted is None or now - self._counted_at > _RECOUNT_SECS
                or limit - counted - needed < self.reserve + _SLACK):
            opened = open_descriptors()
            if opened is None:
                return True, 0, needed
            counted = opened + PER_PARTITION * unopened()
            self._counted_at = now
        wanted = counted + needed + self.kept_free(hard)
        if self.may_raise and limit < min(wanted, hard):
            target = min(hard, wanted)
            try:
                raise_soft_limit(target)
            except (ValueError, OSError):
                pass
            else:
                limit = target
        free = limit - counted
        if needed + self.kept_free(limit) > free:
            self._counted = counted
            return False, free, needed
        self._counted = counted + needed
        return True, free, needed
