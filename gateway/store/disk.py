"""The data directory's disk as a signal the store acts on: free space, the floor it keeps
free, the zeros it writes ahead, and whether it can write now (and why not).

- **Free space** is ``statvfs`` of the data directory (``f_bavail``: what an unprivileged
  writer may still use), looked at every :data:`LOOK_EVERY_SECS` by the store's monitor,
  and again (at most every :data:`LOOK_AGAIN_SECS`) when a write does not fit what was
  seen; between looks each write takes its bytes off what was seen.
- **The floor** (Redpanda's ``storage_min_free_bytes``): the smaller of
  ``store.min_free_bytes`` and ``store.min_free_percent`` of the filesystem's size. A write
  that would leave less free is refused with :class:`~gateway.store.errors.DiskFull`
  before the filesystem would refuse it, so the node keeps room to roll, sync, write its
  offsets and recover, and answers a clear "disk full".
- **Prefill** (the zeros ``fsync`` durability writes ahead of each active segment: an
  fdatasync into them commits no file size) comes only from the space above the floor: at
  most an eighth of it for one segment, none while less than
  :data:`PREFILL_MIN_HEADROOM` is left above it, all segments' together within
  ``store.max_prefill_bytes``; when a write does not fit, the zeros are handed back (the
  active segments trimmed) before it is refused, so freed space goes to messages first.
- **Faults**: a failed write, fsync or creation records its kind (``no_space``,
  ``read_only``, ``io_error``), counts it and logs it, at most one line a minute per
  operation and kind (with how many were held back). It stands until a write succeeds
  again (a failed fsync: until an fsync does), or the monitor's probe (a small file
  written and fsynced in the data directory) does. :meth:`DiskGuard.not_writable` says why
  the store can not write now (``/health`` answers it): read-only, less than
  :data:`READY_MARGIN` free above the floor, or a standing fault. A write refused by the
  floor is not a standing fault by itself (one client's oversized write must not make the
  node unready while smaller ones fit).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from typing import Final

import structlog

from gateway.logevery import LogEvery
from gateway.store.errors import DiskFull, StoreIOError

log = structlog.get_logger("gateway.store")

#: Fault kinds (how the protocols answer them: HTTP 507 / 503 / 500, Kafka
#: KAFKA_STORAGE_ERROR, Tank's I/O fault).
NO_SPACE: Final = "no_space"
READ_ONLY: Final = "read_only"
IO_ERROR: Final = "io_error"
#: The kinds of ``figtank_store_write_failures``: the fault kinds, a failed fsync, and a
#: write the floor refused.
BELOW_FLOOR: Final = "below_floor"
FSYNC: Final = "fsync"

#: Less than this free above the floor is a full disk for readiness: writes of any size
#: would soon be refused.
READY_MARGIN: Final = 1024 * 1024
#: How often the store's monitor looks at the disk (and probes it after a fault).
LOOK_EVERY_SECS: Final = 1.0
#: A write that does not fit what was seen looks again, at most this often.
LOOK_AGAIN_SECS: Final = 0.05
#: No prefill while less than this is free above the floor (a small or nearly full disk
#: keeps its space for messages).
PREFILL_MIN_HEADROOM: Final = 64 * 1024 * 1024
#: A segment's prefill takes at most this share of the space above the floor.
PREFILL_SHARE: Final = 8
#: A prefill smaller than this is not worth its write.
PREFILL_MIN_CHUNK: Final = 256 * 1024
#: The probe's file in the data directory (a dot name: never taken for a topic).
PROBE_NAME: Final = ".figtank-probe"
_PROBE_BYTES: Final = bytes(4096)


def fault_kind(exc: OSError) -> str:
    """The fault kind of a failed write."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NO_SPACE
    if exc.errno == errno.EROFS:
        return READ_ONLY
    return IO_ERROR


def describe_fault(kind: str) -> str:
    """A few words for a fault kind, naming the disk."""
    return {NO_SPACE: "disk full", READ_ONLY: "disk read-only"}.get(kind, "disk I/O error")


def size_text(n: int) -> str:
    """``n`` bytes for people: ``812 B``, ``3.1 KiB``, ``256 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}".replace(".0 ", " ")
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


class DiskGuard:
    """The disk of one data directory, as the store sees it (see the module docstring).

    Everything runs in the trio thread except :meth:`probe` (a worker thread, while no
    other call runs on it) and the reads of the metrics collectors (plain attributes).
    ``on_failure(kind)`` counts a failure (``figtank_store_write_failures``); ``reclaim()``
    trims the zeros ahead of every active segment and returns the bytes it freed (the
    store sets it).
    """

    def __init__(self, directory: str, *, min_free_bytes: int, min_free_percent: float,
                 max_prefill_bytes: int, on_failure: Callable[[str], None] | None = None,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.min_free_bytes = min_free_bytes
        self.min_free_percent = min_free_percent
        self.max_prefill_bytes = max_prefill_bytes
        self._on_failure = on_failure
        self._statvfs = statvfs
        self._clock = clock
        self.reclaim: Callable[[], int] | None = None
        #: At the last look: bytes free to the store, the filesystem's size, the floor in
        #: force, and whether it is mounted read-only.
        self.free = 0
        self.total = 0
        self.floor = 0
        self.read_only = False
        self._looked = -1.0
        #: Bytes above the floor: what was seen, less what was written since.
        self._headroom = 0
        #: Zeros held ahead of all active segments (``prefill_bytes``).
        self.prefill_bytes = 0
        #: The standing fault: ``(kind, why, cleared only by an fsync)``.
        self.fault: tuple[str, str, bool] | None = None
        self._log_every = LogEvery()

    # -- looking --------------------------------------------------------------------------

    def look(self) -> None:
        """``statvfs`` the directory now; a ``no_space`` fault whose write would fit now is
        over. A failed look keeps what was seen."""
        try:
            st = self._statvfs(self.directory)
        except OSError as exc:
            self._log_once("statvfs", IO_ERROR, exc)
            return
        self._looked = self._clock()
        self.total = st.f_blocks * st.f_frsize
        self.free = st.f_bavail * st.f_frsize
        self.floor = min(self.min_free_bytes, int(self.total * self.min_free_percent / 100))
        self.read_only = bool(st.f_flag & os.ST_RDONLY)
        self._headroom = self.free - self.floor
        fault = self.fault
        if fault is not None and fault[0] == NO_SPACE and self._headroom >= READY_MARGIN:
            self.fault = None

    @property
    def headroom(self) -> int:
        """Bytes above the floor (as seen, less what was written since)."""
        return self._headroom

    # -- taking space -----------------------------------------------------------------------

    def take(self, n: int) -> bool:
        """Whether ``n`` more bytes may be written (they are taken off the headroom); when
        they do not fit what was seen, look again and hand back the prefill first."""
        if n <= self._headroom:
            self._headroom -= n
            return True
        return self._take_slowly(n)

    def _take_slowly(self, n: int) -> bool:
        if self._clock() - self._looked >= LOOK_AGAIN_SECS:
            self.look()
        if n > self._headroom and self.prefill_bytes and self.reclaim is not None:
            freed = self.reclaim()
            if freed:
                log.info("prefill_handed_back", bytes=freed, wanted=n, directory=self.directory)
            self.look()
        if n <= self._headroom:
            self._headroom -= n
            return True
        return False

    def refused(self, n: int, **where: object) -> DiskFull:
        """The refusal of a write of ``n`` bytes that did not fit (counted and logged as a
        failure of kind ``below_floor``). It is no standing fault: whether the store is
        writable is what the disk says (:meth:`not_writable`), so that a client sending
        one write too big for what is left does not make the node unready."""
        left = self._headroom + self.floor - n
        why = (f"disk full: {size_text(n)} more would leave {size_text(max(left, 0))} free in "
               f"{self.directory}, under the {size_text(self.floor)} floor kept free "
               "(store.min_free_bytes, store.min_free_percent)")
        self._count(BELOW_FLOOR)
        held = self._log_every.due(("write", BELOW_FLOOR))
        if held is not None:
            log.error("store_write_refused", reason=why, free=self.free, floor=self.floor,
                      held_back=held, **where)
        return DiskFull(why)

    def failed(self, operation: str, exc: OSError, *, record: bool = True,
               **where: object) -> StoreIOError:
        """A failed write, fsync or creation: its error (to raise), recorded as the
        standing fault (unless not ``record``), counted and logged."""
        kind = fault_kind(exc)
        why = f"{describe_fault(kind)}: {operation} in {self.directory} failed: {exc}"
        if record:
            self._record(kind, why, operation == FSYNC)
        self._count(FSYNC if operation == FSYNC else kind)
        self._log_once(operation, kind, exc, **where)
        return StoreIOError(why, kind)

    def wrote(self) -> None:
        """A write went well: a fault it disproves is over (not a failed fsync's)."""
        fault = self.fault
        if fault is not None and not fault[2]:
            self.fault = None

    def synced(self) -> None:
        """An fsync went well: the standing fault is over."""
        self.fault = None

    def _record(self, kind: str, why: str, fsync: bool) -> None:
        self.fault = (kind, why, fsync)

    def _count(self, kind: str) -> None:
        if self._on_failure is not None:
            self._on_failure(kind)

    def _log_once(self, operation: str, kind: str, exc: OSError, **where: object) -> None:
        held = self._log_every.due((operation, kind))
        if held is not None:
            log.error("store_write_failed", operation=operation, kind=kind, error=str(exc),
                      directory=self.directory, held_back=held, **where)

    # -- prefill ----------------------------------------------------------------------------

    def prefill_room(self, want: int) -> int:
        """How many of ``want`` bytes of zeros a segment may write ahead now (0: none)."""
        headroom = self._headroom
        if want <= 0 or headroom < PREFILL_MIN_HEADROOM:
            return 0
        room = min(want, self.max_prefill_bytes - self.prefill_bytes, headroom // PREFILL_SHARE)
        return room if room >= min(want, PREFILL_MIN_CHUNK) else 0

    def zeros_added(self, n: int) -> None:
        """``n`` bytes of zeros were written ahead (taken off the headroom)."""
        self.prefill_bytes += n
        self._headroom -= n

    def zeros_used(self, n: int) -> None:
        """Appends overwrote ``n`` bytes of zeros (the disk holds as much as before)."""
        self.prefill_bytes -= n

    def zeros_freed(self, n: int) -> None:
        """``n`` bytes of zeros were cut off a segment (given back to the headroom)."""
        self.prefill_bytes -= n
        self._headroom += n

    # -- health -----------------------------------------------------------------------------

    def not_writable(self) -> str | None:
        """Why the store can not write now, or None while it can."""
        if self.read_only:
            return f"disk read-only: {self.directory} is on a filesystem mounted read-only"
        above = self.free - self.floor
        if above < READY_MARGIN:
            where = ("under the" if above < 0 else
                     f"less than {size_text(READY_MARGIN)} above the")
            return (f"disk full: {size_text(self.free)} free in {self.directory}, {where} "
                    f"{size_text(self.floor)} floor kept free (store.min_free_bytes, "
                    "store.min_free_percent)")
        fault = self.fault
        return None if fault is None else fault[1]

    @property
    def needs_probe(self) -> bool:
        """Whether a standing fault only a write can disprove stands (not a full disk,
        which looking disproves; not while the filesystem is read-only)."""
        fault = self.fault
        return fault is not None and fault[0] != NO_SPACE and not self.read_only

    def probe(self) -> bool:
        """Write and fsync a small file in the data directory, then remove it (blocking:
        in a worker thread); whether that went well."""
        path = os.path.join(self.directory, PROBE_NAME)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, _PROBE_BYTES)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return True
