"""Opening a partition's directory: its segments listed, the rolled ones opened (and
checked for damage at startup if so configured), the active one recovered
(:func:`open_segments`)."""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass

import structlog

from gateway.store.checks import SegmentChecks
from gateway.store.config import TopicConfig
from gateway.store.damage import CORRUPT_SUFFIX, Damage
from gateway.store.durability import Durability
from gateway.store.env import PartitionEnv
from gateway.store.segment import LogSegment, Recovery, parse_segment_name


@dataclass(slots=True)
class Opened:
    """A partition's segments as found on disk."""

    #: Every segment in base order, the active one (if any) included.
    segments: list[LogSegment]
    #: The active segment (the newest), or None.
    active: LogSegment | None

    @property
    def high_water_mark(self) -> int:
        """The last sequence number the segments hold (0 when none ever was)."""
        hwm = 0
        for seg in self.segments:
            hwm = max(hwm, seg.last_seq if seg.last_seq is not None else seg.base - 1)
        return hwm


def open_segments(directory: str, config: TopicConfig, env: PartitionEnv,
                  checks: SegmentChecks, log: structlog.typing.FilteringBoundLogger) -> Opened:
    """Open the segments in ``directory``, recovering the active segment (its torn tail
    cut, its index repaired; :meth:`LogSegment.recover_active`). Blocking.

    Stray temporary files go; files that are no segment are logged and left; a rolled
    segment that is empty is left out (and reported as damage when it named messages);
    of several active segments all but the newest are rolled (or deleted when empty).
    """
    actives: list[tuple[int, str, int | None]] = []
    rolled: list[tuple[int, int, str, int | None]] = []
    for name in os.listdir(directory):
        if name.startswith("."):
            if name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
            continue
        if name == "config" or name.endswith(CORRUPT_SUFFIX):
            continue  # a config, or bytes recovery cut off a segment (kept for people)
        parsed = parse_segment_name(name)
        if parsed is None:
            log.warning("unexpected_file_ignored", file=name)
        elif parsed.kind == "active":
            actives.append((parsed.base, name, parsed.ts))
        elif parsed.kind == "rolled":
            assert parsed.last is not None
            rolled.append((parsed.base, parsed.last, name, parsed.ts))
    segments: list[LogSegment] = []
    for base, last, name, ts in sorted(rolled):
        ts = ts if ts is not None else _mtime(directory, name)
        seg = LogSegment.open_rolled(directory, name, base, last, ts, env.files)
        if seg.size == 0 or last < base:
            log.error("bad_rolled_segment_ignored", segment=name, size=seg.size)
            seg.close()
            if last >= base:
                checks.report(name, Damage(0, 0, base, last, "empty segment file"))
            continue
        if env.check_rolled == "startup":
            try:
                checks.finish(seg, checks.run(seg))
            except OSError as exc:  # checked when first read instead
                log.error("segment_check_failed", segment=name, error=str(exc))
        segments.append(seg)
    active = None
    actives.sort()
    for i, (base, name, ts) in enumerate(actives):
        ts = ts if ts is not None else _mtime(directory, name)
        seg, report = LogSegment.recover_active(
            directory, name, base, ts, index_interval=config.index_interval_bytes,
            deep_check_bytes=env.recovery_check_bytes)
        _report_recovery(name, report, env, log)
        if i == len(actives) - 1:
            active = seg
            if env.durability is Durability.FSYNC:
                seg.zeros = env.disk
            segments.append(seg)
        elif seg.last_seq is None:  # an older empty active segment: a stray
            seg.delete()
        else:  # more than one active segment: freeze the older ones
            seg.roll(int(env.clock()), env.files)
            seg.close_index()
            checks.mark_clean(seg)
            segments.append(seg)
            log.warning("extra_active_segment_rolled", segment=seg.name)
    segments.sort(key=lambda s: s.base)
    for prev, seg in itertools.pairwise(segments):
        if prev.last_seq is not None and seg.base <= prev.last_seq:
            log.error("segments_overlap", first=prev.name, second=seg.name)
    return Opened(segments, active)


def _mtime(directory: str, name: str) -> int:
    return int(os.stat(os.path.join(directory, name)).st_mtime)


def _report_recovery(name: str, report: Recovery, env: PartitionEnv,
                     log: structlog.typing.FilteringBoundLogger) -> None:
    if report.prefill_trimmed:
        log.info("segment_prefill_trimmed", segment=name, bytes=report.prefill_trimmed)
    if report.bytes_dropped or report.first_seq_lost is not None:
        log.warning("segment_tail_truncated", segment=name,
                    bytes_dropped=report.bytes_dropped, reason=report.reason,
                    bundles_kept=report.bundles,
                    first_seq_lost=report.first_seq_lost,
                    last_seq_lost=report.last_seq_lost,
                    last_seq_exact=report.last_seq_exact,
                    indexed_bytes_missing=report.indexed_past_end or None,
                    corrupt_file=report.corrupt_file)
        if report.corrupt_error is not None:
            log.error("corrupt_copy_failed", segment=name, error=report.corrupt_error)
        if env.on_data_loss is not None:
            first, last = report.first_seq_lost, report.last_seq_lost
            messages = last - first + 1 if first is not None and last is not None else 0
            env.on_data_loss(messages, report.bytes_dropped + report.indexed_past_end)
    if report.index_action:
        log.warning("segment_index_repaired", segment=name, action=report.index_action)
