"""One reader of a partition's tail for the subscribers of every listener that follow it.

Subscribers at the tail of a partition all want the same thing: each append, as soon as
it is there. A :class:`TailReader` long-polls the backend once for all of them,
whatever their protocol (Figg DATA, SSE, WebSocket), and hands each read, a
:class:`TailChunk`, to its *sinks*: the listeners' views of the partition (a Figg topic
name's feed, the HTTP listeners' buffer of events), each of which encodes the chunk in
its forms and feeds its own followers (:mod:`gateway.tail.followers`). A chunk keeps its
raw bytes and a memo of what is made of them (:meth:`TailChunk.encoded`, the shape of
:class:`~gateway.backend.shared.SharedChunk`'s), so each form is built once per chunk,
whoever reads it.

Where the backend pushes its tail reads (:meth:`~gateway.core.contract.Backend.watch_tail`:
upstream-Kafka mode), the reader is the partition's one watcher: each arrival is taken
and handed on from the task that brought it, with no wake-up of the reader's own.

:class:`TailReaders` holds a server's readers, one per (topic, partition): started by
the first subscriber that follows (:meth:`TailReaders.acquire`), stopped
:data:`LINGER_SECS` after the last one left (a reconnecting client finds it). Their
number is bounded by the partitions that have a subscriber at the tail (the gauge
``figtank_tail_readers``).

While the backend's upstream is away (bridge, upstream Kafka) a reader is *unavailable*
(:attr:`TailReader.unavailable` says why) and tells its sinks, which release their
followers and tell their clients; it keeps trying (backoff up to
:data:`FAULT_RETRY_MAX_SECS`) from the same position, and is available again when a
read succeeds or the backend says its upstream answers (:class:`TailReaders` looks every
:data:`WATCH_SECS`): nothing skipped, nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Final, Protocol, TypeVar

import structlog
import trio

from gateway.backend.shared import Encodings
from gateway.core.contract import (
    Backend,
    BackendUnavailable,
    FetchOutcome,
    FetchRequest,
    FetchStatus,
)
from gateway.core.metrics import GaugeCollector, Metrics
from protocols.errors import ProtocolError
from protocols.tank.bundle import chunk_end

__all__ = ["LINGER_SECS", "WATCH_SECS", "TailChunk", "TailReader", "TailReaders", "TailSink"]

log = structlog.get_logger("figtank.tail")

S = TypeVar("S", bound="TailSink")

#: Bytes asked for per read (the backend returns whole bundles, so possibly more).
FETCH_SIZE: Final = 256 * 1024
#: Long-poll time of a read at the end of the log; the reader simply asks again.
MAX_WAIT_MS: Final = 30_000
#: A reader that could not read waits this long before it tries again, doubling up to
#: :data:`FAULT_RETRY_MAX_SECS` (cut short when the backend's upstream is back).
FAULT_RETRY_SECS: Final = 0.25
FAULT_RETRY_MAX_SECS: Final = 2.0
#: How often the readers look whether the backend's upstream went away or came back.
WATCH_SECS: Final = 0.2
#: A reader without subscribers keeps reading this long (a reconnecting client finds it).
LINGER_SECS: Final = 5.0


class TailChunk(Encodings):
    """One read of a partition's tail as its reader hands it on: the raw bytes and what
    is encoded of them (:meth:`~gateway.backend.shared.Encodings.encoded`: each form
    built by the first sink that asks, under a key naming that form)."""

    __slots__ = ("base_seq", "data", "first_seq", "high_water_mark", "next_seq")

    def __init__(self, data: bytes, base_seq: int | None, first_seq: int, next_seq: int,
                 high_water_mark: int) -> None:
        self._encoded = None
        #: The chunk's bytes (``varint len | bundle`` runs; may begin before ``first_seq``).
        self.data = data
        #: The sequence of the chunk's first bundle, None when that bundle is sparse.
        self.base_seq = base_seq
        #: The position it was read from: its messages from here on are the new ones.
        self.first_seq = first_seq
        #: The position after its last whole message.
        self.next_seq = next_seq
        #: The partition's high-water mark when it was read.
        self.high_water_mark = high_water_mark


class TailSink(Protocol):
    """A listener's view of a partition's tail, fed by its :class:`TailReader` (from the
    reader's task, or from the task whose arrival the backend pushed). No method may
    raise."""

    def chunk(self, chunk: TailChunk) -> None:
        """The reader read ``chunk`` (its position moved from ``chunk.first_seq`` to
        ``chunk.next_seq``)."""

    def restart(self, seq: int) -> None:
        """The log's bounds moved (retention): the reader starts over at ``seq``."""

    def outage(self, reason: str) -> None:
        """The partition can not be read now (the backend's upstream is away)."""

    def recovered(self) -> None:
        """The partition can be read again (after :meth:`outage`)."""

    def stop(self, reason: str | None) -> None:
        """The reader stopped: it failed (``reason``) or nobody follows it any more, or the
        server stops (None). Nothing comes after this."""


class TailReader:
    """The one reader of ``topic``/``partition``'s tail and its sinks; see the module
    docstring."""

    __slots__ = ("_backend", "_retry", "_sinks", "_woken", "failed", "high_water_mark",
                 "idle_since", "next_seq", "partition", "reads", "topic", "unavailable",
                 "users")

    def __init__(self, topic: str, partition: int, next_seq: int) -> None:
        self.topic = topic
        self.partition = partition
        #: Where it reads next: everything before it was handed to the sinks.
        self.next_seq = next_seq
        #: The high-water mark its last read saw.
        self.high_water_mark = next_seq - 1
        #: Why it stopped reading (the topic went away, corrupt data), or None.
        self.failed: str | None = None
        #: Why the partition can not be read now (the backend's upstream is away), or None.
        self.unavailable: str | None = None
        #: Subscribers holding it now (:meth:`TailReaders.acquire`).
        self.users = 0
        #: When the last of them left (None while it has some).
        self.idle_since: float | None = None
        #: Reads it made of the backend (long polls and pushed arrivals taken).
        self.reads = 0
        self._sinks: dict[Hashable, TailSink] = {}
        self._retry = trio.Event()
        self._woken: trio.Event | None = None
        self._backend: Backend | None = None

    def sink(self, key: Hashable, make: Callable[[TailReader], S]) -> S:
        """The sink kept under ``key`` (made by ``make(self)`` when it has none): a Figg
        topic name's feed, the HTTP listeners' events, ..."""
        found = self._sinks.get(key)
        if found is None:
            found = self._sinks[key] = make(self)
        sink: S = found  # type: ignore[assignment]  # (one key, one kind of sink)
        return sink

    def find(self, key: Hashable) -> TailSink | None:
        """The sink kept under ``key``, if any."""
        return self._sinks.get(key)

    def drop(self, key: Hashable) -> None:
        """Forget the sink kept under ``key`` (nothing more is handed to it)."""
        self._sinks.pop(key, None)

    @property
    def readable(self) -> bool:
        """Whether it reads now (not failed, not in an outage): a subscriber at its
        position may follow it."""
        return self.failed is None and self.unavailable is None

    # -- what happens to it ----------------------------------------------------------

    def fail(self, reason: str) -> None:
        """It can not read on: tell the sinks."""
        if self.failed is None:
            self.failed = reason
            for sink in list(self._sinks.values()):
                sink.stop(reason)

    def outage(self, reason: str) -> None:
        """The partition can not be read now (the backend's upstream is away)."""
        if self.unavailable is None and self.failed is None:
            self.unavailable = reason
            for sink in list(self._sinks.values()):
                sink.outage(reason)

    def recovered(self) -> None:
        """The partition can be read again: tell the sinks, and the reader to try now."""
        if self.unavailable is not None:
            self.unavailable = None
            for sink in list(self._sinks.values()):
                sink.recovered()
        self._retry.set()

    def stopped(self) -> None:
        """Its task ended: nothing more comes to the sinks."""
        sinks, self._sinks = self._sinks, {}
        if self.failed is None:
            for sink in sinks.values():
                sink.stop(None)

    # -- the reads -------------------------------------------------------------------

    async def read(self, backend: Backend) -> None:
        """Read the partition's appends and hand them to the sinks until cancelled or it
        fails."""
        self._backend = backend
        delay = FAULT_RETRY_SECS
        fetch_size = FETCH_SIZE
        while self.failed is None:
            if fetch_size == FETCH_SIZE and self.unavailable is None:
                await self._pushed(backend)
                if self.failed is not None:
                    return
            request = FetchRequest(self.topic, self.partition, self.next_seq, fetch_size)
            self.reads += 1
            try:
                [outcome] = await backend.fetch([request], max_wait_ms=MAX_WAIT_MS,
                                                min_bytes=1)
                away = backend.unavailable() if outcome.status is FetchStatus.FAULT else None
            except BackendUnavailable as exc:
                outcome, away = None, str(exc)
            if away is not None:
                self.outage(away)
            if outcome is None or outcome.status is FetchStatus.FAULT:  # try again later
                await self._pause(delay)
                delay = min(delay * 2, FAULT_RETRY_MAX_SECS)
                continue
            delay = FAULT_RETRY_SECS
            if self.unavailable is not None:
                self.recovered()
            status = outcome.status
            if status is FetchStatus.DATA:
                fetch_size = self._take(outcome, fetch_size)
            elif status is FetchStatus.BOUNDARY:
                seq = self.next_seq
                target = (outcome.first_available if seq < outcome.first_available
                          else outcome.high_water_mark + 1)
                if target == seq:  # not a boundary after all: do not spin on it
                    await trio.sleep(FAULT_RETRY_SECS)
                self._restart(target, outcome.high_water_mark)
            else:
                self.fail(f"{status.value}: {self.topic}/{self.partition}")

    def _take(self, outcome: FetchOutcome, fetch_size: int) -> int:
        """Hand a read's data on; the fetch size to ask for next (0 when it made no
        progress and a bigger read would not either: the reader failed then)."""
        chunk = outcome.chunk
        try:
            if not chunk.length:
                return fetch_size
            data = chunk.read_bytes()
        finally:
            chunk.close()
        first = self.next_seq
        next_seq, partial = outcome.next_seq, None
        if next_seq is None:  # the backend does not know: the bundles' headers say it
            try:
                next_seq, partial = chunk_end(data, outcome.base_seq, first)
            except ProtocolError as exc:
                self.fail(f"undecodable data at offset {first}: {exc}")
                return 0
        self.high_water_mark = outcome.high_water_mark
        if next_seq > first:
            self.next_seq = next_seq
            piece = TailChunk(data, outcome.base_seq, first, next_seq,
                              outcome.high_water_mark)
            for sink in list(self._sinks.values()):
                sink.chunk(piece)
            return FETCH_SIZE
        if partial and partial > fetch_size:
            return partial  # a backend that cuts chunks (TANK 1 style): ask for the bundle
        # Data that does not move the position: asking again would spin.
        self.fail(f"the backend returned no message at or after offset {first}")
        return 0

    def _restart(self, seq: int, high_water_mark: int) -> None:
        self.next_seq = seq
        self.high_water_mark = high_water_mark
        for sink in list(self._sinks.values()):
            sink.restart(seq)

    async def _pause(self, delay: float) -> None:
        """Wait ``delay`` seconds before reading again, less when :meth:`recovered`."""
        self._retry = trio.Event()
        with trio.move_on_after(delay):
            await self._retry.wait()

    async def _pushed(self, backend: Backend) -> None:
        """Follow the backend's tail read where it pushes
        (:meth:`~gateway.core.contract.Backend.watch_tail`): each arrival is handed on
        from the task that brought it (:meth:`_on_tail`). Returns when the push ends or
        needs the reader's task (a fetch then says why, or waits at the tail); at once
        when the backend has no such read."""
        woken = self._woken = trio.Event()
        unwatch = backend.watch_tail(self.topic, self.partition, self.next_seq,
                                     self._on_tail)
        if unwatch is None:
            self._woken = None
            return
        try:
            with trio.move_on_after(MAX_WAIT_MS / 1000):
                await woken.wait()
        finally:
            unwatch()
            self._woken = None

    def _on_tail(self, ok: bool) -> None:
        """The backend's tail read moved (see :meth:`_pushed`): hand on what came, as
        after a fetch; wake the task for anything else (an error, a cut chunk)."""
        woken = self._woken
        backend = self._backend
        if woken is None or woken.is_set() or backend is None:
            return
        delivered = False
        try:
            while ok and self.failed is None:
                self.reads += 1
                got = backend.fetch_nowait(
                    [FetchRequest(self.topic, self.partition, self.next_seq, FETCH_SIZE)])
                if got is None:
                    if delivered:
                        return  # all that came is handed on: the next arrival calls again
                    # Nothing of it for us: an empty long poll, or a read that went past
                    # our position (control records, a compaction gap). The task's fetch
                    # tells which, and reads on from our position.
                    break
                [outcome] = got
                if outcome.status is not FetchStatus.DATA:
                    break
                before = self.next_seq
                self._take(outcome, FETCH_SIZE)
                if self.next_seq <= before:
                    break  # no whole message: the task asks for more
                delivered = True
                if self.next_seq > outcome.high_water_mark:
                    return  # all there was: the next arrival calls again
        except Exception as exc:  # (a sink must not raise; the task's fetch sees a fault)
            log.warning("tail_push_failed", topic=self.topic, partition=self.partition,
                        error=repr(exc))
        woken.set()


class TailReaders:
    """A server's tail readers, by (topic, partition); their tasks run in :meth:`run`'s
    nursery. One set for every listener of a backend (Figg, HTTP), so each partition is
    read once, whoever follows it."""

    def __init__(self, backend: Backend, metrics: Metrics | None = None) -> None:
        self._backend = backend
        self._readers: dict[tuple[str, int], TailReader] = {}
        self._scopes: dict[int, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._scope = trio.CancelScope()
        if metrics is not None:
            metrics.add_collector(GaugeCollector(
                "figtank_tail_readers", "Partitions whose tail is read once for every "
                "listener's subscribers that follow it (Figg, SSE, WebSocket).", [],
                lambda: [([], float(len(self._readers)))]))

    def __len__(self) -> int:
        return len(self._readers)

    def get(self, topic: str, partition: int) -> TailReader | None:
        """The reader of ``topic``/``partition``, if it has one."""
        return self._readers.get((topic, partition))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run the readers until cancelled or :meth:`stop`."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reap)
                if self._backend.has_upstream:
                    nursery.start_soon(self._watch)
                task_status.started()
                await trio.sleep_forever()

    def stop(self) -> None:
        """Stop every reader (the server stops)."""
        self._scope.cancel()

    def acquire(self, topic: str, partition: int, next_seq: int) -> TailReader:
        """The reader of ``topic``/``partition`` (started at ``next_seq``, the partition's
        end, when new); give it back with :meth:`release`."""
        key = (topic, partition)
        reader = self._readers.get(key)
        if reader is None or reader.failed is not None:
            if self._nursery is None:
                raise RuntimeError("the tail readers are not running")
            reader = self._readers[key] = TailReader(topic, partition, next_seq)
            self._nursery.start_soon(self._read, reader)
        elif reader.unavailable is not None and self._backend.unavailable() is None:
            # The upstream is back and the watch has not said so yet (it looks every
            # WATCH_SECS): a subscriber joining now is not told of an outage that ended.
            reader.recovered()
        reader.users += 1
        reader.idle_since = None
        return reader

    def release(self, reader: TailReader) -> None:
        """A subscriber leaves ``reader`` (it stops :data:`LINGER_SECS` after the last)."""
        reader.users -= 1
        if reader.users <= 0:
            reader.idle_since = trio.current_time()

    async def _read(self, reader: TailReader) -> None:
        with trio.CancelScope() as scope:
            self._scopes[id(reader)] = scope
            try:
                await reader.read(self._backend)
            except Exception as exc:  # a backend fault fails the reader, not the server
                log.warning("tail_reader_failed", topic=reader.topic,
                            partition=reader.partition, error=repr(exc))
                reader.fail(repr(exc))
            finally:
                self._scopes.pop(id(reader), None)
                if self._readers.get((reader.topic, reader.partition)) is reader:
                    del self._readers[(reader.topic, reader.partition)]
                reader.stopped()

    async def _watch(self) -> None:
        """Tell the readers when the backend's upstream goes away or comes back: their
        subscribers hear of it within :data:`WATCH_SECS`, not when a read, which may be
        a long poll waiting for the upstream, returns."""
        was: str | None = None
        while True:
            await trio.sleep(WATCH_SECS)
            reason = self._backend.unavailable()
            if reason is not None:
                for reader in list(self._readers.values()):
                    reader.outage(reason)
            else:
                # Every reader on the way back, and any a read marked since (a fetch begun
                # in the outage failing after it ended): it would say so only when its
                # next read returns, up to a long poll later.
                for reader in list(self._readers.values()):
                    if was is not None or reader.unavailable is not None:
                        reader.recovered()
            was = reason

    async def _reap(self) -> None:
        """Stop the readers nobody followed for :data:`LINGER_SECS`."""
        while True:
            await trio.sleep(1.0)
            now = trio.current_time()
            for reader in list(self._readers.values()):
                if reader.users <= 0 and reader.idle_since is not None and (
                        now - reader.idle_since >= LINGER_SECS):
                    del self._readers[(reader.topic, reader.partition)]
                    scope = self._scopes.get(id(reader))
                    if scope is not None:
                        scope.cancel()
