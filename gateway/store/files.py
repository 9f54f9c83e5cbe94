"""Segment file descriptors: one per segment file, shared by its readers, and a bound on
how many rolled segments hold one.

A :class:`SegmentFile` is one open descriptor with a reference count. The segment holds
one reference while it keeps the file open; every :class:`~gateway.store.results.ReadResult`
of the file holds another until it is closed. The descriptor closes when the last
reference goes, so a range handed to a reader stays readable after the segment was rolled
(renamed), deleted by retention, or closed by :class:`OpenFiles`, and queued Consume
chunks cost no descriptor of their own.

:class:`OpenFiles` keeps at most ``limit`` rolled segments' files open, least recently
read closed first; a rolled segment reopens its file on its next read. Everything here
runs in the trio thread (a worker thread that uses a segment's file holds a reference).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import structlog

from gateway.logevery import LogEvery

log = structlog.get_logger("gateway.store")


class SegmentFile:
    """An open descriptor shared by reference counting; closed with the last reference."""

    __slots__ = ("_refs", "fd")

    def __init__(self, fd: int) -> None:
        #: The descriptor (-1 once closed).
        self.fd = fd
        self._refs = 1

    def __repr__(self) -> str:
        return f"<SegmentFile fd={self.fd} refs={self._refs}>"

    @property
    def refs(self) -> int:
        """References held (0 once closed)."""
        return self._refs

    def acquire(self) -> SegmentFile:
        """Take one more reference; returns ``self``."""
        if self._refs <= 0:
            raise ValueError("acquire of a closed SegmentFile")
        self._refs += 1
        return self

    def release(self) -> None:
        """Drop one reference; the last closes the descriptor."""
        self._refs -= 1
        if self._refs == 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class _Closable(Protocol):
    def drop_file(self) -> None: ...


class OpenFiles:
    """The rolled segments whose files are open, at most ``limit``, least recently used
    first out. ``on_evict`` is called for every file closed to stay within the limit."""

    def __init__(self, limit: int, on_evict: Callable[[], None] | None = None) -> None:
        if limit < 1:
            raise ValueError("at least one rolled segment file must be allowed open")
        self.limit = limit
        self.on_evict = on_evict
        #: Files closed to stay within the limit so far.
        self.evictions = 0
        self._open: OrderedDict[int, _Closable] = OrderedDict()
        self._log_every = LogEvery()
        self._logged_evictions = 0

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, segment: _Closable) -> None:
        """``segment`` (a rolled segment with its file open) was just used; closes the
        least recently used others' files beyond the limit."""
        key = id(segment)
        if key in self._open:
            self._open.move_to_end(key)
            return
        self._open[key] = segment
        while len(self._open) > self.limit:
            _, oldest = self._open.popitem(last=False)
            oldest.drop_file()
            self._evicted()

    def forget(self, segment: _Closable) -> None:
        """``segment`` closed its file itself (deleted, or the store closes)."""
        self._open.pop(id(segment), None)

    def _evicted(self) -> None:
        self.evictions += 1
        if self.on_evict is not None:
            self.on_evict()
        if self._log_every.due() is not None:
            log.info("open_segments_limit_reached", limit="max_open_segments",
                     max_open_segments=self.limit,
                     closed_since_last=self.evictions - self._logged_evictions)
            self._logged_evictions = self.evictions
