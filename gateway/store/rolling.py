"""A partition's chain of segment files (:class:`SegmentChain`): starting the active
segment, rolling it, retention, the zeros written ahead of it, and what a sync round must
cover after such changes."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Final

import structlog

from gateway.store.checks import SegmentChecks
from gateway.store.config import TopicConfig
from gateway.store.durability import Durability, SyncJob
from gateway.store.env import PartitionEnv
from gateway.store.producers import ProducerTable
from gateway.store.segment import LogSegment

#: In fsync durability, zeros are written this far ahead of the active segment's data
#: (topped up whenever fewer than PREFILL_LOW bytes are left); see LogSegment.prefill.
PREFILL_AHEAD: Final = 4 * 1024 * 1024
PREFILL_LOW: Final = 2 * 1024 * 1024


class SegmentChain:
    """The segments of a partition in sequence order, the active one (if any) last.

    ``segments`` and ``bases`` are the partition's lists, changed here in place. The
    partition holds its active segment itself (its appends read it every time): the
    methods that change it take it and say what follows. ``config`` gives the partition's
    current topic config.
    """

    def __init__(self, directory: str, env: PartitionEnv, segments: list[LogSegment],
                 bases: list[int], checks: SegmentChecks, config: Callable[[], TopicConfig],
                 log: structlog.typing.FilteringBoundLogger, topic: str, index: int) -> None:
        self.directory = directory
        self._env = env
        self._fsync = env.durability is Durability.FSYNC
        self.segments = segments
        self.bases = bases
        self._checks = checks
        self._config = config
        self._log = log
        self._topic = topic
        self._index = index
        #: The directory changed (a segment created, renamed or deleted) since the last sync.
        self.dir_dirty = False
        #: Descriptors of rolled segments the next sync round covers (and closes).
        self.sync_extra: list[int] = []

    def adopt(self, segments: list[LogSegment]) -> None:
        """Take ``segments`` (recovered, in order) as the chain."""
        self.segments[:] = segments
        self.bases[:] = [s.base for s in segments]

    def roll_deadline(self, created_ts: float) -> float:
        """When an active segment created at ``created_ts`` rolls by age."""
        config = self._config()
        max_jitter = config.roll_jitter_secs
        jitter = random.uniform(0, max_jitter) if max_jitter else 0
        return created_ts + max(1.0, config.roll_secs - jitter)

    def start(self, base: int, now: float) -> LogSegment:
        """Create the next active segment, based at ``base``."""
        seg = LogSegment.create(self.directory, base, int(now))
        if self._fsync:
            seg.zeros = self._env.disk
        self.segments.append(seg)
        self.bases.append(base)
        self.dir_dirty = True
        return seg

    def drop_empty(self, seg: LogSegment) -> None:
        """Delete ``seg``, an empty active segment."""
        assert seg.size == 0
        self.remove(seg)
        seg.delete()
        self.dir_dirty = True

    def remove(self, seg: LogSegment) -> None:
        """Take ``seg`` out of the chain (its files stay)."""
        i = self.segments.index(seg)
        del self.segments[i]
        del self.bases[i]
        self._checks.forget(seg.base)

    def roll(self, seg: LogSegment, now: float) -> None:
        """Freeze active ``seg`` as ``.ilog`` (an empty one is deleted instead); the
        caller starts the next one. Raises the rename's OSError (nothing changed)."""
        if seg.size == 0:
            self.drop_empty(seg)
            return
        to_sync: list[int] = []
        try:
            to_sync.append(os.dup(seg.fd))
            index_fd = seg.index().fd
            if index_fd >= 0:
                to_sync.append(os.dup(index_fd))
        except OSError:
            pass  # the data was synced already in fsync mode; an unsynced index is rebuilt
        try:
            seg.roll(int(now), self._env.files)
        except OSError:
            for fd in to_sync:
                os.close(fd)
            raise
        seg.close_index()
        self._checks.mark_clean(seg)
        self.sync_extra.extend(to_sync)
        self.dir_dirty = True
        self._log.info("segment_rolled", segment=seg.name, size=seg.size)

    def apply_retention(self, now: float, *, has_active: bool) -> None:
        """Delete the oldest rolled segments the topic's retention no longer keeps."""
        cfg = self._config()
        if cfg.cleanup_policy != "delete":
            return
        rolled = [s for s in self.segments if s.rolled]
        if not has_active and rolled:
            rolled.pop()  # keep a segment on disk: it carries the high-water mark
        total = sum(s.size for s in rolled)
        while rolled:
            seg = rolled[0]
            if cfg.retention_segments and len(rolled) > cfg.retention_segments:
                reason = "retention.segments.count"
            elif cfg.retention_bytes and total > cfg.retention_bytes:
                reason = "log.retention.bytes"
            elif (cfg.retention_secs and seg.rolled_ts is not None
                  and seg.rolled_ts + cfg.retention_secs < now):
                reason = "log.retention.secs"
            else:
                break
            rolled.pop(0)
            total -= seg.size
            self.remove(seg)
            name = seg.name
            seg.delete()
            self.dir_dirty = True
            self._log.info("segment_deleted", segment=name, reason=reason)

    def prefill(self, seg: LogSegment) -> None:
        """Keep zeros :data:`PREFILL_AHEAD` bytes ahead of active ``seg``'s data (up to
        its roll size): the fsyncs of appends into them need no journal commit. Only from
        the space the disk's guard allows (above the floor, within the bound of all
        prefill together)."""
        up_to = min(seg.size + PREFILL_AHEAD, max(self._config().segment_bytes, seg.size))
        disk = self._env.disk
        if disk is not None:
            up_to = seg.prefilled + disk.prefill_room(up_to - seg.prefilled)
        if up_to <= seg.prefilled:
            return
        try:
            seg.prefill(up_to)
        except OSError as exc:  # only a missed speed-up: appends work without it
            if disk is not None:
                disk.failed("prefill", exc, record=False, topic=self._topic,
                            partition=self._index, segment=seg.name)
            else:
                self._log.warning("segment_prefill_failed", segment=seg.name, error=str(exc))

    def hand_back_zeros(self, seg: LogSegment | None) -> int:
        """Cut the zeros written ahead of active ``seg``; the bytes given back."""
        if seg is None or not seg.file_open or seg.prefilled <= seg.size:
            return 0
        held = seg.prefilled - seg.size
        try:
            seg.trim()
        except OSError as exc:
            self._log.warning("segment_trim_failed", segment=seg.name, error=str(exc))
            return 0
        return held

    def trim(self, seg: LogSegment | None) -> None:
        """Leave active ``seg`` ending with its data (a Tank broker reads it so)."""
        if seg is not None and seg.file_open:
            try:
                seg.trim()
            except OSError as exc:  # recovery trims the zeros at the next start
                self._log.warning("segment_trim_failed", segment=seg.name, error=str(exc))

    def sync_job(self, active: LogSegment | None, producers: ProducerTable) -> SyncJob:
        """What the next sync round flushes: the rolled segments' descriptors, the
        producer state, the active segment and, when it changed, the directory."""
        job = SyncJob()
        job.fds, self.sync_extra = self.sync_extra, []
        producers_fd = producers.sync_fd()
        if producers_fd is not None:
            job.fds.append(producers_fd)
        if producers.renamed:
            producers.renamed = False
            self.dir_dirty = True
        if active is not None and active.file_open:
            job.fds.append(os.dup(active.fd))
        if self.dir_dirty:
            self.dir_dirty = False
            job.directory = self.directory
        return job

    def close(self) -> None:
        """Close every segment's files."""
        for seg in self.segments:
            seg.close()

