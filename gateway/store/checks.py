"""The damage checks of a partition's rolled segments (:class:`SegmentChecks`).

A rolled segment is checked (:func:`~gateway.store.damage.check_segment_file`) before it
is first read, or at startup with ``check_rolled="startup"``: a small one at once, in the
reader's call; a big one in a worker thread while readers get
:class:`~gateway.store.errors.SegmentCheckPending`. Its damaged regions are logged once
(``data_loss``) and never served; reads go through the check's index entries.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
import trio

from gateway.store.damage import Damage, SegmentCheck, check_segment_file, clean_check
from gateway.store.env import PartitionEnv
from gateway.store.errors import SegmentCheckPending, StoreIOError
from gateway.store.index import read_index_file
from gateway.store.segment import LogSegment


class SegmentChecks:
    """What the damage checks found in a partition's rolled segments, by segment base,
    and the checks running in worker threads.

    ``segments`` is the partition's list of segments (a check finishing in a thread is
    kept only while its segment is still there); ``interval`` gives the partition's
    current index interval (the index entries a check makes).
    """

    def __init__(self, env: PartitionEnv, segments: list[LogSegment],
                 interval: Callable[[], int], log: structlog.typing.FilteringBoundLogger
                 ) -> None:
        self._env = env
        self._segments = segments
        self._interval = interval
        self._log = log
        #: What the damage check found in each rolled segment, by segment base.
        self.found: dict[int, SegmentCheck] = {}
        #: Checks running in a worker thread (set when done), and those that failed.
        self._running: dict[int, trio.Event] = {}
        self._errors: dict[int, str] = {}

    def checked(self, seg: LogSegment) -> SegmentCheck:
        """The damage check of rolled ``seg``: made now if small, else started in a
        worker thread (raises :class:`SegmentCheckPending`)."""
        check = self.found.get(seg.base)
        if check is not None:
            return check
        error = self._errors.pop(seg.base, None)
        if error is not None:  # the last attempt failed: say so once, try again next time
            raise StoreIOError(f"{seg.name}: cannot check the segment: {error}")
        if seg.size > self._env.inline_check_bytes:
            if seg.base not in self._running:
                done = self._running[seg.base] = trio.Event()
                self._env.spawn(self._check_in_thread, seg, done)
            raise SegmentCheckPending(f"{seg.name} is being checked")
        try:
            check = self.run(seg)
        except OSError as exc:
            self._log.error("segment_check_failed", segment=seg.name, error=str(exc))
            raise StoreIOError(f"{seg.name}: cannot check the segment: {exc}") from exc
        self.finish(seg, check)
        return check

    async def _check_in_thread(self, seg: LogSegment, done: trio.Event) -> None:
        try:
            # Abandoned at shutdown: the thread reads its own descriptor to the end.
            check = await trio.to_thread.run_sync(self.run, seg,
                                                  limiter=self._env.check_limiter,
                                                  abandon_on_cancel=True)
        except OSError as exc:
            self._log.error("segment_check_failed", segment=seg.name, error=str(exc))
            self._errors[seg.base] = str(exc)
        else:
            if seg in self._segments:  # not removed by retention meanwhile
                self.finish(seg, check)
        finally:
            del self._running[seg.base]
            done.set()

    def run(self, seg: LogSegment) -> SegmentCheck:
        """Check ``seg``'s file (blocking: in a worker thread when it is big). Touches only
        what a rolled segment never changes."""
        assert seg.last_seq is not None
        rels, offsets, _ = read_index_file(seg.index_path)
        return check_segment_file(seg.path, seg.base, seg.last_seq, index_rels=rels,
                                  index_offsets=offsets, interval=self._interval())

    def finish(self, seg: LogSegment, check: SegmentCheck) -> None:
        """Keep ``check``, read ``seg`` through its index entries, report its damage."""
        self.found[seg.base] = check
        seg.use_index(check.rels, check.offsets, write=check.clean)
        for damage in check.damage:
            self.report(seg.name, damage)

    def mark_clean(self, seg: LogSegment) -> None:
        """Record ``seg``, rolled by this process from data it wrote, as undamaged."""
        assert seg.last_seq is not None
        self.found[seg.base] = clean_check(seg.base, seg.last_seq, seg.size)

    def forget(self, base: int) -> None:
        """Drop the check of the segment based at ``base`` (deleted)."""
        self.found.pop(base, None)

    def report(self, segment: str, damage: Damage) -> None:
        """One ``data_loss`` line and the data-loss metrics for a damaged region."""
        self._log.error("data_loss", segment=segment, first_seq=damage.first_lost,
                        last_seq=damage.last_lost, messages=damage.lost_range,
                        bytes=damage.size, offset=damage.offset, reason=damage.reason)
        if self._env.on_data_loss is not None:
            self._env.on_data_loss(damage.lost_range, damage.size)

    async def wait(self) -> None:
        """Wait for the checks running in worker threads."""
        while self._running:
            await next(iter(self._running.values())).wait()

    def damage(self) -> list[tuple[str, Damage]]:
        """``(segment name, damage)`` of every damaged region found so far."""
        return [(seg.name, d) for seg in self._segments
                if (c := self.found.get(seg.base)) is not None for d in c.damage]
