"""The HTTP listeners' view of a partition's tail: the newest messages, decoded once.

Subscribers that keep up all want the same thing: each append as soon as it is durable.
The partition's one :class:`~gateway.tail.reader.TailReader` (shared with every other
listener's subscribers: Figg's too) long-polls the backend for all of them; its
:class:`PartitionTail` sink decodes each chunk once (kept with the chunk) and keeps the
newest messages as :class:`TailEvent`\\ s (within ``http.tail_buffer_bytes``). An event
encodes itself once per form (its JSON, its SSE block, its WebSocket frame) the first
time a subscriber asks, and every other subscriber sends the same bytes object.
Subscribers wait on a :class:`trio.Event` the tail sets when it appends (no per-message
await); one that is behind the buffer reads the log on its own
(:mod:`gateway.http.cursor`).

The :class:`Tails` of a listener hold the partitions' readers for its subscribers (a
reader stops a few seconds after its last subscriber of any listener left).

While the backend's upstream is away (bridge, upstream Kafka), a tail is *unavailable*
(:attr:`PartitionTail.unavailable`: its reader's outage): its followers are released and
every waiting subscriber woken, to tell its client
(:class:`~gateway.http.cursor.Unavailable`). The reader keeps trying from the same
position; when it can read again, subscribers resume where they were, nothing skipped,
nothing twice.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable
from typing import Final, Protocol, TypeGuard, cast

import trio
from prometheus_client import Counter
from wsproto.frame_protocol import FrameProtocol

from gateway.http.messages import decode_messages, dumps, message_json
from gateway.io.writer import FrameWriter
from gateway.tail import reader as reader_module
from gateway.tail.followers import FED, RELEASE, Followers
from gateway.tail.reader import TailChunk, TailReader, TailReaders
from protocols.errors import ProtocolError
from protocols.tank.bundle import Message

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
    """The newest messages of one partition and the subscribers waiting for more: a sink
    of the partition's :class:`~gateway.tail.reader.TailReader`."""

    def __init__(self, reader: TailReader, budget: int) -> None:
        self.reader = reader
        self.topic = reader.topic
        self.partition = reader.partition
        next_seq = reader.next_seq
        #: The sequence after the buffer's last event (where the reader reads next);
        #: every event below it is in the buffer from :attr:`first_seq` on.
        self.next_seq = next_seq
        self.budget = budget
        #: Why the tail stopped (the topic went away, undecodable data), or None.
        self.failed: str | None = None
        #: HTTP subscribers holding it now (of every HTTP listener), and since when it
        #: has none (its reader may go on for other listeners' subscribers).
        self.holders = 0
        self.idle_since: float | None = None
        self._events: list[TailEvent] = []
        self._seqs: list[int] = []
        #: Bytes of every event appended before each event (for :meth:`bytes_after`).
        self._before: list[int] = []
        self._total = 0
        self._start = 0  # index of the first live entry of _events
        self._first_seq = next_seq
        self._bytes = 0
        self._wakers: list[trio.Event] = []
        #: Subscribers fed by the reader itself (those whose sockets are free through a
        #: fan-out group of their form: sent each append in one call).
        self._followers = _TailFollowers(self)
        #: The newest batches as sent, by (form, first seq, last seq, count).
        self._joined: dict[tuple[str, int, int, int], bytes] = {}

    @classmethod
    def of(cls, budget: int) -> Callable[[TailReader], PartitionTail]:
        """What makes a reader's tail of ``budget`` bytes (:meth:`TailReader.sink`)."""
        return lambda reader: cls(reader, budget)

    @staticmethod
    def key(budget: int) -> Hashable:
        """The key of the tail of ``budget`` bytes among its reader's sinks (one for every
        HTTP listener of the server: their settings are the same)."""
        return ("http", budget)

    @property
    def unavailable(self) -> str | None:
        """Why the partition can not be read now (the backend's upstream is away), or
        None."""
        return self.reader.unavailable

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
                or self.reader.unavailable is not None):
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

    # The reader's sink (gateway.tail.reader.TailSink).

    def chunk(self, chunk: TailChunk) -> None:
        """The reader read ``chunk``: its messages (decoded once per chunk) join the
        buffer and go to the followers."""
        if self.failed is not None:
            return
        if self.idle_since is not None and (
                trio.current_time() - self.idle_since >= reader_module.LINGER_SECS):
            # No HTTP subscriber for a while (the reader goes on for others): stop
            # decoding; the next HTTP subscriber makes a new tail.
            self.reader.drop(PartitionTail.key(self.budget))
            self.fail("no HTTP subscriber")
            return
        try:
            events = chunk.encoded(_EVENTS, lambda: self._events_of(chunk))
        except ProtocolError as exc:
            self.fail(f"undecodable data at offset {chunk.first_seq}: {exc}")
            return
        self.append(events, chunk.next_seq)

    def _events_of(self, chunk: TailChunk) -> list[TailEvent]:
        found = decode_messages(chunk.data, chunk.base_seq, chunk.first_seq)
        return events_of(self.topic, self.partition, found.messages)

    def restart(self, seq: int) -> None:
        """The log's bounds moved (retention): start over at ``seq``."""
        self.skip_to(seq)

    def skip_to(self, seq: int) -> None:
        """Start over at ``seq`` (the followers released at the positions they had)."""
        self._followers.release_all()
        self._events, self._seqs, self._before, self._start, self._bytes = [], [], [], 0, 0
        self.next_seq = self._first_seq = seq
        self._wake()

    def fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason
        self._followers.release_all()
        self._wake()

    def outage(self, reason: str) -> None:
        """The partition can not be read now (its reader's outage): release the followers
        and wake every subscriber, to tell their clients."""
        self._followers.release_all()
        self._wake()

    def recovered(self) -> None:
        """The partition can be read again: wake the subscribers (to resume)."""
        self._wake()

    def stop(self, reason: str | None) -> None:
        """The reader stopped: failed (``reason``), or idle or the server stops."""
        if reason is not None:
            self.fail(reason)
        else:
            self._followers.release_all()
            self._wake()

    def _wake(self) -> None:
        wakers, self._wakers = self._wakers, []
        for waker in wakers:
            waker.set()


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
    """What one HTTP listener's subscribers hold of the server's tail readers: the
    partitions' :class:`PartitionTail`\\ s, by (topic, partition)."""

    def __init__(self, readers: TailReaders, budget: int) -> None:
        self._readers = readers
        self._key = PartitionTail.key(budget)
        self._make = PartitionTail.of(budget)
        #: The tails the listener's subscribers hold, with how many hold each.
        self._held: dict[PartitionTail, int] = {}

    def __len__(self) -> int:
        return len(self._held)

    def get(self, topic: str, partition: int) -> PartitionTail | None:
        """The tail of ``topic``/``partition``, while its reader runs."""
        reader = self._readers.get(topic, partition)
        found = None if reader is None else reader.find(self._key)
        return found if isinstance(found, PartitionTail) else None

    def acquire(self, topic: str, partition: int, next_seq: int) -> PartitionTail:
        """The tail of ``topic``/``partition`` (its reader started at ``next_seq``, the
        partition's end, when new); give it back with :meth:`release`."""
        reader = self._readers.acquire(topic, partition, next_seq)
        tail = reader.sink(self._key, self._make)
        if tail.failed is not None and reader.failed is None:
            # It could not decode what its reader read (the others may have), or it
            # stopped for want of HTTP subscribers: a new one at the reader's position.
            reader.drop(self._key)
            tail = reader.sink(self._key, self._make)
        tail.holders += 1
        tail.idle_since = None
        self._held[tail] = self._held.get(tail, 0) + 1
        return tail

    def release(self, tail: PartitionTail) -> None:
        held = self._held.get(tail, 0) - 1
        if held > 0:
            self._held[tail] = held
        else:
            self._held.pop(tail, None)
        tail.holders -= 1
        if tail.holders <= 0:
            tail.idle_since = trio.current_time()
        self._readers.release(tail.reader)


#: The key of a chunk's events in its encodings.
_EVENTS: Final = ("http", "events")
