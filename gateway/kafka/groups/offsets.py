"""The consumer groups' committed offsets, kept in one append-only file.

Every OffsetCommit or OffsetDelete is one record appended to ``figtank-offsets.log``
(``offsets.file``; in the data directory's root by default): ``u32 length, u32 crc32,
payload``. Appends waiting at the same moment are written together, and in
``store.durability = "fsync"`` mode fsynced once; a request is answered only after its
record is written (``os`` mode) or fsynced (``fsync`` mode). A record is all or nothing:
at start-up the file is read back and the first record that is short or fails its
checksum ends it (the torn tail of a crash); it is cut off, with a log line.

When the file outgrows ``offsets.compact_bytes`` and twice what it holds live, it is
rewritten: the live offsets go to ``figtank-offsets.log.compacting``, which is fsynced and
renamed over the log (and the directory fsynced), so a crash leaves either file whole.
Appends go to the new file from the rename on; when the directory's fsync fails it is
tried again before the next append is acknowledged. A compaction that fails (the log is
kept, the partial copy removed) is not tried again for :data:`COMPACT_RETRY_SECS`.

The file is a regular file in the data directory's root: a Tank broker ignores those
("not a directory"), and the embedded store only loads directories. Nothing here makes a
directory.

Bounds: ``offsets.max_entries`` (group x partition offsets kept), ``offsets.max_bytes``
(their group, topic and metadata bytes: memory and the compacted file's size) and
``offsets.metadata_max_bytes`` (Kafka's ``offset.metadata.max.bytes``); a commit over them
is refused per partition (INVALID_COMMIT_OFFSET_SIZE, OFFSET_METADATA_TOO_LARGE), counted in
``figtank_limit_hits_total`` and logged.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import time
import zlib
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog
import trio

from gateway.core.metrics import Metrics
from gateway.logevery import LogEvery
from gateway.store.durability import sync_directory
from gateway.store.recordfile import COMPACTING, append_whole, replace_whole, write_new
from protocols.kafka.types import ErrorCode

log = structlog.get_logger("figtank.kafka.offsets")

#: The file's name in the data directory (a regular file: see the module doc).
FILE_NAME: Final = "figtank-offsets.log"
#: The suffix of the file a compaction writes before renaming it over the log.
#: The first bytes of the file.
MAGIC: Final = b"FTOFFS1\n"

_COMMIT: Final = 1
_DELETE: Final = 2
_HEAD = struct.Struct(">II")      # length, crc32 of the payload
_KIND = struct.Struct(">BHI")     # kind, group length, entry count (the group follows)
_ENTRY = struct.Struct(">iqqi")   # partition, offset, timestamp, metadata length (-1: null)
_PART = struct.Struct(">i")
#: What one entry costs against ``offsets.max_bytes`` beside its strings.
ENTRY_OVERHEAD: Final = 64
#: Seconds before a compaction that failed is tried again.
COMPACT_RETRY_SECS: Final = 60.0

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Committed:
    """A partition's committed offset: Kafka's (the next offset the group reads, which is
    the Tank sequence / Figg offset of the last message it consumed)."""

    offset: int
    metadata: str | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OffsetLimits:
    """The bounds of the store (see the module doc)."""

    max_entries: int = 100_000
    max_bytes: int = 64 * 1024 * 1024
    metadata_max_bytes: int = 4096
    compact_bytes: int = 16 * 1024 * 1024


class OffsetFileError(Exception):
    """The offsets file can not be used (not ours, or unreadable)."""


def _cost(group: str, topic: str, metadata: str | None) -> int:
    return ENTRY_OVERHEAD + len(group) + len(topic) + (len(metadata) if metadata else 0)


def _str(text: str, width: str = ">H") -> bytes:
    data = text.encode()
    return struct.pack(width, len(data)) + data


def encode_commit(group: str, entries: Sequence[tuple[str, int, Committed]]) -> bytes:
    """One framed record committing ``entries`` ``(topic, partition, committed)``."""
    gid = group.encode()
    parts = [_KIND.pack(_COMMIT, len(gid), len(entries)), gid]
    for topic, partition, c in entries:
        meta = None if c.metadata is None else c.metadata.encode()
        parts += [_str(topic), _ENTRY.pack(partition, c.offset, c.timestamp_ms,
                                           -1 if meta is None else len(meta)), meta or b""]
    return _frame(b"".join(parts))


def encode_delete(group: str, keys: Sequence[Key]) -> bytes:
    """One framed record deleting the offsets of ``keys`` ``(topic, partition)``."""
    gid = group.encode()
    parts = [_KIND.pack(_DELETE, len(gid), len(keys)), gid]
    for topic, partition in keys:
        parts += [_str(topic), _PART.pack(partition)]
    return _frame(b"".join(parts))


def _frame(payload: bytes) -> bytes:
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _read_str(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">H", data, pos)
    end = pos + 2 + n
    if end > len(data):
        raise ValueError("string past the record's end")
    return data[pos + 2:end].decode(), end


def _apply_payload(state: dict[str, dict[Key, Committed]], payload: bytes) -> None:
    """Apply one record's payload (ValueError/struct.error/UnicodeError: not a record)."""
    kind, glen, count = _KIND.unpack_from(payload, 0)
    pos = _KIND.size
    group = payload[pos:pos + glen].decode()
    pos += glen
    changes: list[tuple[Key, Committed | None]] = []
    for _ in range(count):
        topic, pos = _read_str(payload, pos)
        if kind == _COMMIT:
            partition, offset, stamp, mlen = _ENTRY.unpack_from(payload, pos)
            pos += _ENTRY.size
            meta = None
            if mlen >= 0:
                if pos + mlen > len(payload):
                    raise ValueError("metadata past the record's end")
                meta = payload[pos:pos + mlen].decode()
                pos += mlen
            changes.append(((topic, partition), Committed(offset, meta, stamp)))
        elif kind == _DELETE:
            (partition,) = _PART.unpack_from(payload, pos)
            pos += _PART.size
            changes.append(((topic, partition), None))
        else:
            raise ValueError(f"record kind {kind}")
    if pos != len(payload):
        raise ValueError("bytes after the record's entries")
    _apply(state, group, changes)


def _apply(state: dict[str, dict[Key, Committed]], group: str,
           changes: Iterable[tuple[Key, Committed | None]]) -> None:
    offsets = state.get(group)
    for key, committed in changes:
        if committed is None:
            if offsets is not None:
                offsets.pop(key, None)
        else:
            if offsets is None:
                offsets = state[group] = {}
            offsets[key] = committed
    if offsets is not None and not offsets:
        del state[group]


def recover(path: Path) -> tuple[dict[str, dict[Key, Committed]], int]:
    """Read the offsets file: ``(state, size of its whole records)``. A torn or damaged
    tail is cut off (logged); a missing file is created. Blocking."""
    state: dict[str, dict[Key, Committed]] = {}
    leftover = path.with_name(path.name + COMPACTING)
    with contextlib.suppress(FileNotFoundError):
        leftover.unlink()  # a compaction the process did not finish: the log is whole
        log.warning("offsets_compaction_unfinished", file=str(leftover), action="removed")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as exc:
        raise OffsetFileError(f"cannot read {path}: {exc.strerror}") from None
    if not data or (len(data) < len(MAGIC) and MAGIC.startswith(data)):
        write_new(path, MAGIC)
        return state, len(MAGIC)
    if not data.startswith(MAGIC):
        raise OffsetFileError(f"{path} is not a figtank offsets file (move it away)")
    pos = len(MAGIC)
    while pos < len(data):
        if pos + _HEAD.size > len(data):
            break
        length, crc = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + length
        if end > len(data):
            break
        payload = data[pos + _HEAD.size:end]
        if zlib.crc32(payload) != crc:
            break
        try:
            _apply_payload(state, payload)
        except (ValueError, struct.error):  # UnicodeDecodeError is a ValueError
            break
        pos = end
    if pos < len(data):
        log.warning("offsets_torn_tail_dropped", file=str(path), kept_bytes=pos,
                    dropped_bytes=len(data) - pos,
                    action="cut off: commits in it were never acknowledged")
        with open(path, "r+b") as f:
            f.truncate(pos)
            os.fsync(f.fileno())
    return state, pos


class _Batch:
    """Records written (and fsynced) together, and who waits for them."""

    __slots__ = ("changes", "done", "error", "records")

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.changes: list[tuple[str, list[tuple[Key, Committed | None]]]] = []
        self.done = trio.Event()
        self.error: str | None = None


class OffsetStore:
    """The committed offsets of every group, server-wide (one per server; every Kafka
    listener shares it). ``path`` None keeps them in memory only (bridge mode without
    ``offsets.file``). Open it with :func:`open_offset_store`."""

    def __init__(self, path: Path | None, *, fsync: bool = True,
                 limits: OffsetLimits | None = None, metrics: Metrics | None = None) -> None:
        self.path = path
        self.fsync = fsync
        self.limits = limits or OffsetLimits()
        self._metrics = metrics
        self._state: dict[str, dict[Key, Committed]] = {}
        self._entries = 0
        self._bytes = 0
        #: Entries and bytes of records queued and not applied yet (counted as if new).
        self._pending_entries = 0
        self._pending_bytes = 0
        self._size = 0
        self._fd: int | None = None
        self._batch: _Batch | None = None
        self._wake = trio.Event()
        self._log_every = LogEvery()
        self.compactions = 0
        #: A compaction renamed the file but the directory's fsync failed: done again
        #: before the next append is acknowledged.
        self._dir_unsynced = False
        #: No compaction before this time (trio clock) after one failed.
        self._compact_not_before = -math.inf

    # -- reading -------------------------------------------------------------------------

    def groups(self) -> list[str]:
        """The groups with committed offsets (the coordinator lists them as Empty)."""
        return sorted(self._state)

    def has_group(self, group: str) -> bool:
        return group in self._state

    def committed(self, group: str) -> dict[Key, Committed]:
        """A copy of ``group``'s committed offsets by ``(topic, partition)``."""
        return dict(self._state.get(group, {}))

    def get(self, group: str, topic: str, partition: int) -> Committed | None:
        offsets = self._state.get(group)
        return None if offsets is None else offsets.get((topic, partition))

    @property
    def entries(self) -> int:
        """Offsets kept (group x partition)."""
        return self._entries

    @property
    def file_bytes(self) -> int:
        return self._size

    # -- writing -------------------------------------------------------------------------

    async def commit(self, group: str, entries: Sequence[tuple[str, int, int, str | None]]
                     ) -> list[int]:
        """Commit ``entries`` ``(topic, partition, offset, metadata)`` of ``group``; the
        error code of each (NONE once durable). The accepted ones are one record."""
        now = int(time.time() * 1000)
        codes: list[int] = []
        accepted: list[tuple[str, int, Committed]] = []
        limits = self.limits
        current = self._state.get(group, {})
        for topic, partition, offset, metadata in entries:
            if metadata is not None and len(metadata.encode()) > limits.metadata_max_bytes:
                codes.append(ErrorCode.OFFSET_METADATA_TOO_LARGE)
                self._hit("metadata_max_bytes", group=group, topic=topic)
                continue
            cost = _cost(group, topic, metadata)
            new = (topic, partition) not in current
            if new and self._entries + self._pending_entries + 1 > limits.max_entries:
                codes.append(ErrorCode.INVALID_COMMIT_OFFSET_SIZE)
                self._hit("max_entries", group=group, topic=topic)
                continue
            if self._bytes + self._pending_bytes + cost > limits.max_bytes:
                codes.append(ErrorCode.INVALID_COMMIT_OFFSET_SIZE)
                self._hit("max_bytes", group=group, topic=topic)
                continue
            self._pending_entries += 1
            self._pending_bytes += cost
            accepted.append((topic, partition, Committed(offset, metadata, now)))
            codes.append(ErrorCode.NONE)
        if accepted:
            changes: list[tuple[Key, Committed | None]] = [((t, p), c) for t, p, c in accepted]
            error = await self._write(group, encode_commit(group, accepted), changes,
                                      len(accepted), sum(_cost(group, t, c.metadata)
                                                         for t, _, c in accepted))
            if error is not None:
                codes = [error if c == ErrorCode.NONE else c for c in codes]
        return codes

    async def delete(self, group: str, keys: Sequence[Key]) -> int:
        """Delete ``group``'s offsets of ``keys``; an error code (NONE once durable)."""
        present = [k for k in keys if k in self._state.get(group, {})]
        if not present:
            return ErrorCode.NONE
        error = await self._write(group, encode_delete(group, present),
                                  [(k, None) for k in present], 0, 0)
        return ErrorCode.NONE if error is None else error

    async def _write(self, group: str, record: bytes,
                     changes: list[tuple[Key, Committed | None]], entries: int,
                     cost: int) -> int | None:
        if self.path is None:  # in memory: nothing to wait for
            self._pending_entries -= entries
            self._pending_bytes -= cost
            self._apply(group, changes)
            return None
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            self._wake.set()
        batch.records.append(record)
        batch.changes.append((group, changes))
        try:  # a cancelled caller's record is still written (and never acknowledged)
            await batch.done.wait()
        finally:
            self._pending_entries -= entries
            self._pending_bytes -= cost
        return None if batch.error is None else ErrorCode.COORDINATOR_NOT_AVAILABLE

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Write the queued records, a batch at a time, until cancelled."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            batch, self._batch = self._batch, None
            if batch is None:
                continue
            data = b"".join(batch.records)
            if self._fd is not None:
                try:
                    await trio.to_thread.run_sync(self._append, data)
                except OSError as exc:
                    batch.error = exc.strerror or repr(exc)
                    log.error("offsets_write_failed", file=str(self.path),
                              error=batch.error, requests=len(batch.records),
                              action="answered COORDINATOR_NOT_AVAILABLE (retriable)")
            if batch.error is None:
                for group, changes in batch.changes:
                    self._apply(group, changes)
            batch.done.set()
            if self._fd is not None and self._should_compact():
                await self._compact()

    def _append(self, data: bytes) -> None:
        """Append ``data`` (and fsync); on failure cut the file back to its whole
        records, so that what follows is not lost behind a torn record. Worker thread."""
        assert self._fd is not None and self.path is not None
        if self._dir_unsynced:
            sync_directory(str(self.path.parent))
            self._dir_unsynced = False
        self._size = append_whole(self._fd, data, self._size, fsync=self.fsync)

    def _apply(self, group: str, changes: list[tuple[Key, Committed | None]]) -> None:
        offsets = self._state.get(group, {})
        for (topic, partition), committed in changes:
            old = offsets.get((topic, partition))
            if old is not None:
                self._entries -= 1
                self._bytes -= _cost(group, topic, old.metadata)
            if committed is not None:
                self._entries += 1
                self._bytes += _cost(group, topic, committed.metadata)
        _apply(self._state, group, changes)

    # -- compaction ----------------------------------------------------------------------

    def _should_compact(self) -> bool:
        return (self._size > max(self.limits.compact_bytes, 2 * (self._bytes + len(MAGIC)))
                and trio.current_time() >= self._compact_not_before)

    async def _compact(self) -> None:
        snapshot = [(group, [(t, p, c) for (t, p), c in offsets.items()])
                    for group, offsets in self._state.items()]
        before = self._size
        try:
            size = await trio.to_thread.run_sync(self._rewrite, snapshot)
        except OSError as exc:
            self._compact_not_before = trio.current_time() + COMPACT_RETRY_SECS
            log.error("offsets_compaction_failed", file=str(self.path),
                      error=exc.strerror or repr(exc), action="the log is kept as it is; "
                      f"tried again in {COMPACT_RETRY_SECS:g} s at the earliest")
            return
        self.compactions += 1
        log.info("offsets_compacted", file=str(self.path), bytes_before=before,
                 bytes_after=size, groups=len(snapshot), entries=self._entries)

    def _rewrite(self, snapshot: list[tuple[str, list[tuple[str, int, Committed]]]]) -> int:
        """Write the live offsets to a new file and rename it over the log. Worker
        thread; the writer task waits for it, so nothing is appended meanwhile. Once
        renamed, appends go to the new file whatever fails next (an OSError from the
        directory's fsync: see ``_dir_unsynced``)."""
        assert self.path is not None and self._fd is not None
        data = MAGIC + b"".join(encode_commit(g, entries) for g, entries in snapshot)
        fd = replace_whole(self.path, data, os.O_APPEND)
        old, self._fd = self._fd, fd
        self._size = len(data)
        self._dir_unsynced = True
        with contextlib.suppress(OSError):
            os.close(old)
        sync_directory(str(self.path.parent))
        self._dir_unsynced = False
        return self._size

    # -- opening -------------------------------------------------------------------------

    def load(self) -> None:
        """Read the file back (see :func:`recover`) and open it for appending. Blocking."""
        if self.path is None:
            return
        state, size = recover(self.path)
        self._state = state
        self._size = size
        for group, offsets in state.items():
            for (topic, _), committed in offsets.items():
                self._entries += 1
                self._bytes += _cost(group, topic, committed.metadata)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if self._entries > self.limits.max_entries or self._bytes > self.limits.max_bytes:
            log.warning("offsets_over_limits", entries=self._entries, bytes=self._bytes,
                        max_entries=self.limits.max_entries, max_bytes=self.limits.max_bytes,
                        action="kept; new partitions are refused until some are deleted")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _hit(self, limit: str, **fields: object) -> None:
        name = f"offsets.{limit}"
        if self._metrics is not None:
            self._metrics.limit_hit(name)
        if self._log_every.due(name) is not None:
            limit_value = getattr(self.limits, limit)
            log.warning("offsets_limit_reached", limit=name, value=limit_value, **fields,
                        action="commit refused for this partition (logged once a minute)")


@asynccontextmanager
async def open_offset_store(path: Path | None, *, fsync: bool = True,
                            limits: OffsetLimits | None = None,
                            metrics: Metrics | None = None) -> AsyncIterator[OffsetStore]:
    """An :class:`OffsetStore` read back from ``path`` (None: in memory), writing until
    the block ends. :class:`OffsetFileError` when the file can not be used."""
    store = OffsetStore(path, fsync=fsync, limits=limits, metrics=metrics)
    try:
        await trio.to_thread.run_sync(store.load)
    except OSError as exc:
        raise OffsetFileError(f"cannot open {path}: {exc.strerror}") from None
    log.info("offsets_loaded", file=str(path) if path else None, groups=len(store.groups()),
             entries=store.entries, durable=path is not None)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            yield store
            nursery.cancel_scope.cancel()
    finally:
        store.close()
