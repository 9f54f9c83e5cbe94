"""One reader of a partition's tail for every live HTTP subscriber (SSE and WebSocket).

Subscribers that keep up all want the same thing: each append as soon as it is durable.
A :class:`PartitionTail` long-polls the backend once for all of them, decodes each chunk
once and keeps the newest messages as :class:`TailEvent`\\ s (within
``http.tail_buffer_bytes``). An event encodes itself once per form (its JSON, its SSE
block, its WebSocket frame) the first time a subscriber asks, and every other subscriber
sends the same bytes object. Subscribers wait on a :class:`trio.Event` the tail sets when
it appends (no per-message await); one that is behind the buffer reads the log on its own
(:mod:`gateway.http.cursor`).

The :class:`Tails` of a listener start a partition's reader with its first subscriber and
stop it a few seconds after its last one left.

While the backend's upstream is away (bridge, upstream Kafka), a tail is *unavailable*
(:attr:`PartitionTail.unavailable` says why): its followers are released and every waiting
subscriber woken, to tell its client (:class:`~gateway.http.cursor.Unavailable`). The
reader keeps trying (backoff up to :data:`FAULT_RETRY_MAX_SECS`) from the same position,
and the tail is available again when a read succeeds or the backend says its upstream
answers (:class:`Tails` looks every :data:`WATCH_SECS`): subscribers resume where they
were, nothing skipped, nothing twice.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Final, Protocol, TypeGuard, cast

import structlog
import trio
from prometheus_client import Counter
from wsproto.frame_protocol import FrameProtocol

from gateway.core.contract import (
    Backend,
    BackendUnavailable,
    FetchRequest,
    FetchStatus,
)
from gateway.http.messages import decode_messages, dumps, message_json
from gateway.io.writer import FrameWriter
from gateway.tail.followers import FED, RELEASE, Followers
from protocols.errors import ProtocolError
from protocols.tank.bundle import Message

log = structlog.get_logger("figtank.http")

FETCH_SIZE: Final = 256 * 1024
MAX_WAIT_MS: Final = 30_000
#: A reader that could not read waits this long before it tries again, doubling up to
#: :data:`FAULT_RETRY_MAX_SECS` (cut short when the backend's upstream is back).
FAULT_RETRY_SECS: Final = 0.25
FAULT_RETRY_MAX_SECS: Final = 2.0
#: How often the tails look whether the backend's upstream went away or came back.
WATCH_SECS: Final = 0.2
#: A tail without subscribers keeps reading this long (a reconnecting client finds it).
LINGER_SECS: Final = 5.0
#: Joined batches a tail keeps (subscribers at the tail send the newest few).
JOINED_BATCHES: Final = 16

_frames = FrameProtocol(client=False, extensions=[])


class TailEvent:
    """One message, with its encodings made once and shared by every subscriber."""

    __slots__ = ("_json", "_sse", "_ws", "message", "partition", "seq", "size", "topic")

    def __init__(self, topic: str, partition: int, message: Message) -> None:
        self.topic = topic
        self.partition = partition
        self.message = message
        self.seq = message.seq
        self.size = len(message.value) + len(message.key or b"") + 64
        self._json: bytes | None = None
        self._sse: bytes | None = None
        self._ws: bytes | bytearray | None = None

    def json(self) -> bytes:
        """The message's JSON object (:func:`gateway.http.messages.message_json`)."""
        if self._json is None:
            self._json = dumps(message_json(self.topic, self.partition, self.message))
        return self._json

    def sse_data(self) -> bytes:
        """The event's ``data:`` line and the blank line ending it (shared by streams whose
        ids differ)."""
        return b"data: " + self.json() + b"\n\n"

    def sse(self) -> bytes:
        """The whole SSE event of a one-partition stream: its id is the offset."""
        if self._sse is None:
            self._sse = b"id: %d\n%s" % (self.seq, self.sse_data())
        return self._sse

    def ws_frame(self) -> bytes | bytearray:
        """The WebSocket text frame ``{"op":"data",...}`` (server frames are not masked, so
        one framing serves every connection)."""
        if self._ws is None:
            text = (b'{"op":"data",' + self.json()[1:]).decode()
            self._ws = _frames.send_data(text, fin=True)  # str: a text frame
        return self._ws


class Follower(Protocol):
    """A subscriber at the tail that the tail's reader feeds directly."""

    @property
    def fanout_form(self) -> str | None:
        """Followers with the same form get the same bytes at the tail (one fan-out
        group); None: never through a group (its bytes are its own, or each write is
        counted)."""

    @property
    def next_seq(self) -> int:
        """The sequence the subscriber delivers next (stale while in a fan-out group:
        :meth:`settle` brings it up to date when it leaves)."""

    def push(self, tail: PartitionTail, events: list[TailEvent]) -> bool:
        """Queue ``events`` (those from ``next_seq`` on) for the client, and move past
        them; False (nothing queued) when the client is too far behind to take them."""


class GroupFollower(Follower, Protocol):
    """A follower with a :attr:`~Follower.fanout_form`: fed through a fan-out group while
    its socket keeps up."""

    #: Its connection's writer.
    outbox: FrameWriter

    @property
    def delivered(self) -> Counter:
        """The counter of messages delivered (one per topic: ``inc(n)``)."""

    def encode(self, tail: PartitionTail, events: list[TailEvent]) -> bytes:
        """``events`` as sent on the subscriber's connection (the same bytes for every
        follower of its form)."""

    def settle(self, next_seq: int, sent: int) -> None:
        """It left its fan-out group at ``next_seq``, having been sent ``sent`` bytes
        through it."""


def in_fanout(follower: Follower) -> TypeGuard[GroupFollower]:
    """Whether ``follower`` joins a fan-out group at the tail (it has a form)."""
    return follower.fanout_form is not None


def events_of(topic: str, partition: int, messages: list[Message]) -> list[TailEvent]:
    return [TailEvent(topic, partition, m) for m in messages]


class PartitionTail:
    """The newest messages of one partition and the subscribers waiting for more."""

    def __init__(self, topic: str, partition: int, next_seq: int, budget: int) -> None:
        self.topic = topic
        self.partition = partition
        #: The sequence the reader asks for next; every event below it is in the buffer
        #: from :attr:`first_seq` on.
        self.next_seq = next_seq
        self.budget = budget
        #: Subscribers using the tail now.
        self.users = 0
        #: Why the tail stopped reading (the topic went away), or None.
        self.failed: str | None = None
        #: Why the partition can not be read now (the backend's upstream is away), or None.
        self.unavailable: str | None = None
        self._retry = trio.Event()
        self._events: list[TailEvent] = []
        self._seqs: list[int] = []
        #: Bytes of every event appended before each event (for :meth:`bytes_after`).
        self._before: list[int] = []
        self._total = 0
        self._start = 0  # index of the first live entry of _events
        self._first_seq = next_seq
        self._bytes = 0
        self._wakers: list[trio.Event] = []
        self.idle_since: float | None = None
        #: Subscribers fed by the reader itself (those whose sockets are free through a
        #: fan-out group of their form: sent each append in one call).
        self._followers = _TailFollowers(self)
        #: The newest batches as sent, by (form, first seq, last seq, count).
        self._joined: dict[tuple[str, int, int, int], bytes] = {}

    @property
    def first_seq(self) -> int:
        """The lowest sequence a subscriber can be served from the buffer."""
        return self._first_seq

    def joined(self, form: str, events: list[TailEvent],
               frame: Callable[[bytes], bytes] | None = None) -> bytes:
        """``events`` encoded (``form``: ``"sse"`` or ``"ws"``) and joined, then passed
        through ``frame`` when given (an SSE batch as a piece of a chunked HTTP body, as
        h11 frames it; the same for every connection): made once for every subscriber
        that sends the same batch (those at the tail all do)."""
        key = (form if frame is None else form + "+framed", events[0].seq, events[-1].seq,
               len(events))
        found = self._joined.get(key)
        if found is None:
            if frame is not None:
                found = frame(self.joined(form, events))
            else:
                encode = TailEvent.sse if form == "sse" else TailEvent.ws_frame
                found = events[0].sse() if len(events) == 1 and form == "sse" else (
                    b"".join([encode(e) for e in events]))
            if len(self._joined) >= JOINED_BATCHES:
                del self._joined[next(iter(self._joined))]
            self._joined[key] = found
        return found

    def wake_me(self, waker: trio.Event) -> None:
        """Set ``waker`` at the next append (or failure)."""
        self._wakers.append(waker)

    def follow(self, follower: Follower, released: trio.Event | None = None
               ) -> trio.Event | None:
        """Feed ``follower`` (at the end of the buffer) each append from the reader task:
        no task of its own wakes per message. Returns the event set when it is released
        (it fell behind, the tail failed, started over or became unavailable), or None when
        it is not at the end now (or the tail is unavailable). ``released``: that event,
        shared by the followers of several tails (one whole-topic stream:
        :mod:`gateway.http.topic_follow`)."""
        if (follower.next_seq != self.next_seq or self.failed is not None
                or self.unavailable is not None):
            return None
        return self._followers.add(follower, released)

    def unfollow(self, follower: Follower) -> None:
        """Stop feeding ``follower`` (its position is up to date after this)."""
        self._followers.remove(follower)

    def in_group(self, follower: Follower) -> bool:
        """Whether ``follower`` is fed through its form's fan-out group now."""
        return self._followers.in_group(follower)

    def settle(self, follower: Follower) -> None:
        """Bring ``follower``'s position up to date: out of its fan-out group (it joins
        again at an append that finds its socket free). Called when bytes are queued in
        its writer: from then on it is fed through the writer, in order."""
        self._followers.settle(follower)

    def since(self, seq: int, max_bytes: int) -> list[TailEvent] | None:
        """Events from ``seq`` on, up to about ``max_bytes`` (at least one); None when
        ``seq`` is before the buffer (read the log)."""
        if seq < self._first_seq:
            return None
        if seq >= self.next_seq:
            return []
        i = bisect.bisect_left(self._seqs, seq, self._start)
        out: list[TailEvent] = []
        size = 0
        events = self._events
        while i < len(events) and (size < max_bytes or not out):
            event = events[i]
            out.append(event)
            size += event.size
            i += 1
        return out

    def bytes_after(self, seq: int) -> int:
        """Bytes of the buffered events from ``seq`` on (how far behind a subscriber is)."""
        if seq >= self.next_seq:
            return 0
        i = bisect.bisect_left(self._seqs, seq, self._start)
        return self._total - self._before[i] if i < len(self._before) else 0

    def append(self, events: list[TailEvent], next_seq: int) -> None:
        """Add what the reader read and wake the subscribers."""
        before = self._before
        total = self._total
        for event in events:
            before.append(total)
            total += event.size
        self._bytes += total - self._total
        self._total = total
        self._events += events
        self._seqs += [e.seq for e in events]
        self.next_seq = next_seq
        while self._bytes > self.budget and self._start < len(self._events) - 1:
            self._bytes -= self._events[self._start].size
            self._start += 1
        if self._start:
            self._first_seq = self._seqs[self._start]
            if self._start > 1024 and self._start * 2 > len(self._events):
                del self._events[:self._start], self._seqs[:self._start]
                del self._before[:self._start]
                self._start = 0
        elif not self._events:
            self._first_seq = next_seq
        if events and len(self._followers):
            self._followers.fan_out(events)
        self._wake()

    def skip_to(self, seq: int) -> None:
        """The log's bounds moved (retention): start over at ``seq``."""
        self._followers.release_all()  # (at the positions they had)
        self._events, self._seqs, self._before, self._start, self._bytes = [], [], [], 0, 0
        self.next_seq = self._first_seq = seq
        self._wake()

    def fail(self, reason: str) -> None:
        self.failed = reason
        self._followers.release_all()
        self._wake()

    def outage(self, reason: str) -> None:
        """The partition can not be read now (the backend's upstream is away): release the
        followers and wake every subscriber, to tell their clients."""
        if self.unavailable is None:
            self.unavailable = reason
            self._followers.release_all()
            self._wake()

    def recovered(self) -> None:
        """The partition can be read again: wake the subscribers (to resume) and the
        reader (to try now)."""
        if self.unavailable is not None:
            self.unavailable = None
            self._wake()
        self._retry.set()

    async def _pause(self, delay: float) -> None:
        """Wait ``delay`` seconds before reading again, less when :meth:`recovered`."""
        self._retry = trio.Event()
        with trio.move_on_after(delay):
            await self._retry.wait()

    def _wake(self) -> None:
        wakers, self._wakers = self._wakers, []
        for waker in wakers:
            waker.set()

    async def read(self, backend: Backend) -> None:
        """Read the partition's appends into the buffer until cancelled or it fails."""
        delay = FAULT_RETRY_SECS
        while self.failed is None:
            request = FetchRequest(self.topic, self.partition, self.next_seq, FETCH_SIZE)
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
            status = outcome.status
            delay = FAULT_RETRY_SECS
            if self.unavailable is not None:
                self.recovered()
            if status is FetchStatus.DATA:
                chunk = outcome.chunk
                try:
                    if not chunk.length:
                        continue
                    data = chunk.read_bytes()
                finally:
                    chunk.close()
                try:
                    found = decode_messages(data, outcome.base_seq, self.next_seq)
                except ProtocolError as exc:
                    self.fail(f"undecodable data at offset {self.next_seq}: {exc}")
                    return
                if found.next_seq > self.next_seq:
                    self.append(events_of(self.topic, self.partition, found.messages),
                                found.next_seq)
            elif status is FetchStatus.BOUNDARY:
                seq = self.next_seq
                target = (outcome.first_available if seq < outcome.first_available
                          else outcome.high_water_mark + 1)
                if target == seq:
                    await trio.sleep(FAULT_RETRY_SECS)
                self.skip_to(target)
            else:
                self.fail(f"{status.value}: {self.topic}/{self.partition}")


class _TailFollowers(Followers[Follower, list[TailEvent]]):
    """The followers of a :class:`PartitionTail`, fed each append (a list of events)."""

    __slots__ = ("_tail",)

    def __init__(self, tail: PartitionTail) -> None:
        super().__init__()
        self._tail = tail

    def _feed(self, follower: Follower, events: list[TailEvent]) -> int:
        start = events[0].seq
        if follower.next_seq > start:  # (never ahead)
            return RELEASE
        if in_fanout(follower) and follower.next_seq == start and follower.outbox.free:
            return follower.outbox.fd
        return FED if follower.push(self._tail, events) else RELEASE

    def _form(self, follower: Follower) -> str | None:
        return follower.fanout_form

    def _encode(self, first: Follower, events: list[TailEvent], members: int) -> bytes:
        member = cast(GroupFollower, first)
        member.delivered.inc(members * len(events))
        return member.encode(self._tail, events)

    def _on_queue(self, follower: Follower, callback: Callable[[], None]) -> None:
        cast(GroupFollower, follower).outbox.on_queue(callback)

    def _forget_on_queue(self, follower: Follower, callback: Callable[[], None]) -> None:
        cast(GroupFollower, follower).outbox.forget_on_queue(callback)

    def _queue_rest(self, follower: Follower, data: bytes, result: int) -> None:
        cast(GroupFollower, follower).outbox.put_nowait(data[result:] if result > 0 else data)

    def _settled(self, follower: Follower, sent: int) -> None:
        cast(GroupFollower, follower).settle(self._tail.next_seq, sent)


class Tails:
    """The partition tails of one listener, by (topic, partition); their readers run in
    :meth:`run`'s nursery."""

    def __init__(self, backend: Backend, budget: int) -> None:
        self._backend = backend
        self._budget = budget
        self._tails: dict[tuple[str, int], PartitionTail] = {}
        self._scopes: dict[int, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None

    def __len__(self) -> int:
        return len(self._tails)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run the readers until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._reap)
            if self._backend.has_upstream:
                nursery.start_soon(self._watch)
            task_status.started()
            await trio.sleep_forever()

    def acquire(self, topic: str, partition: int, next_seq: int) -> PartitionTail:
        """The tail of ``topic``/``partition`` (started at ``next_seq``, the partition's
        end, when new); give it back with :meth:`release`."""
        key = (topic, partition)
        tail = self._tails.get(key)
        if tail is None or tail.failed is not None:
            tail = self._tails[key] = PartitionTail(topic, partition, next_seq, self._budget)
            if self._nursery is None:
                raise RuntimeError("the tails are not running")
            self._nursery.start_soon(self._read, tail)
        elif tail.unavailable is not None and self._backend.unavailable() is None:
            # The upstream is back and the watch has not said so yet (it looks every
            # WATCH_SECS): a subscriber joining now is not told of an outage that ended.
            tail.recovered()
        tail.users += 1
        tail.idle_since = None
        return tail

    def release(self, tail: PartitionTail) -> None:
        tail.users -= 1
        if tail.users <= 0:
            tail.idle_since = trio.current_time()

    async def _read(self, tail: PartitionTail) -> None:
        with trio.CancelScope() as scope:
            self._scopes[id(tail)] = scope
            try:
                await tail.read(self._backend)
            except Exception as exc:  # a backend fault fails the tail, not the listener
                log.warning("http_tail_failed", topic=tail.topic, partition=tail.partition,
                            error=repr(exc))
                tail.fail(repr(exc))
            finally:
                self._scopes.pop(id(tail), None)
                if self._tails.get((tail.topic, tail.partition)) is tail:
                    del self._tails[(tail.topic, tail.partition)]

    async def _watch(self) -> None:
        """Tell the tails when the backend's upstream goes away or comes back: their
        subscribers hear of it within :data:`WATCH_SECS`, not when a read, which may be
        a long poll waiting for the upstream, returns."""
        was: str | None = None
        while True:
            await trio.sleep(WATCH_SECS)
            reason = self._backend.unavailable()
            if reason is not None:
                for tail in list(self._tails.values()):
                    tail.outage(reason)
            else:
                # Every tail on the way back, and any a read marked since (a fetch begun in
                # the outage failing after it ended): its reader would say so only when
                # its next read returns, up to a long poll later.
                for tail in list(self._tails.values()):
                    if was is not None or tail.unavailable is not None:
                        tail.recovered()
            was = reason

    async def _reap(self) -> None:
        """Stop the readers of tails nobody used for :data:`LINGER_SECS`."""
        while True:
            await trio.sleep(1.0)
            now = trio.current_time()
            for tail in list(self._tails.values()):
                if tail.users <= 0 and tail.idle_since is not None and (
                        now - tail.idle_since >= LINGER_SECS):
                    del self._tails[(tail.topic, tail.partition)]
                    scope = self._scopes.get(id(tail))
                    if scope is not None:
                        scope.cancel()

