"""The subscribers of a Figg topic that keep up, fed by the partition's one tail reader.

Subscribers at the tail of a partition all want the same thing: each append, as soon as
it is durable. Instead of each of them waking up, fetching and converting on its own, they
follow the topic name's :class:`TailFeed`, a sink of the partition's
:class:`~gateway.tail.reader.TailReader` (the one reader of the partition for every
listener's subscribers: Figg, SSE, WebSocket): the reader long-polls the backend once for
everyone, the feed turns each chunk into DATA frames once (compiled; kept with the chunk,
so each topic name's frames are made once per chunk) and hands the frames to every
follower. A subscriber that reaches the tail at the feed's position follows it and sleeps
until released. A follower is released (and reads on its own from where it stands) when
its connection falls behind (its outbox is full), or when the reader meets anything but
data (an outage, a boundary, a failure, its end). Subscribers that are behind read the log
on their own, as before, so a slow client still only makes its own subscriptions lag.

The followers whose sockets are free (nothing queued in their outbox, its writer task
idle, a plain socket, no bytes-out limit) are in the feed's
:class:`~gateway.io.fanout.FanoutGroup`: each delivery is written to all of their sockets
in one compiled pass (:func:`gateway.io.fanout.send_each`), with no Python per follower.
The ones a pass could not finish (a full socket buffer, a partial write, an error) leave
the group and get the rest through their own outbox, in order; a follower also leaves the
group the moment anything is queued in its outbox (an ACK or reply its socket did not take
at once), so nothing the group writes can overtake it. The others are fed one by one
(:meth:`Follower.take`) and join the group at a delivery that finds their socket free.
A member's position is brought up to date when it leaves the group (every member has
had every delivery since it joined: the group sends whole deliveries); its reader lag
(which records only how far behind it is, the same for every member) when it joins and
whenever a delivery's lag differs from the one before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.figg.offsets import figg_to_tank
from gateway.tail.followers import Followers
from gateway.tail.reader import TailChunk, TailReader, TailReaders
from protocols.errors import ProtocolError
from protocols.translate import DataFrames, data_frames


class OutQuota(Protocol):
    """A principal's bytes-out limit (:class:`gateway.auth.quotas.PrincipalQuota`)."""

    #: Whether data sent is charged (a reload may set or lift a limit).
    out_limited: bool


class Follower(Protocol):
    """What a feed needs of a subscription."""

    next_seq: int
    detached: bool

    @property
    def quota(self) -> OutQuota | None:
        """Its principal's quota, if any (a member leaves the group when it limits bytes
        out)."""

    def take(self, frames: bytes, count: int, next_seq: int, high_water_mark: int) -> bool:
        """Queue frames a feed read; False when its connection is too far behind."""

    def direct_fd(self) -> int:
        """The socket to write its frames to directly now (nothing queued before them,
        no quota to charge), or -1."""

    def on_queue(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time bytes are queued in its outbox (not
        written at once) or the outbox closes."""

    def forget_on_queue(self, callback: Callable[[], None]) -> None:
        """Forget a callback left with :meth:`on_queue`."""

    def queue_rest(self, rest: bytes, begun: bool) -> None:
        """Queue in its outbox what a group send did not write (``begun``: the rest of a
        frame already partly written, which must go out even if it detaches)."""

    def settle(self, next_seq: int, high_water_mark: int) -> None:
        """It left the feed's group at ``next_seq``: bring its position (and its reader
        lag) up to date."""

    def report_lag(self, next_seq: int, high_water_mark: int) -> None:
        """Record its reader lag as of a delivery up to ``next_seq - 1``."""

    def count_out(self, messages: int, size: int) -> None:
        """Count ``messages`` DATA frames (``size`` bytes) sent to the group's members."""


#: What a feed delivers: the DATA frames of the messages up to ``next_seq - 1``, how many
#: messages they hold, ``next_seq`` and the high-water mark (a plain tuple: made for every
#: delivery).
_Delivery = tuple[bytes, int, int, int]


def feed_key(topic: bytes) -> tuple[str, bytes]:
    """The key of Figg topic name ``topic``'s feed among its reader's sinks, and of its
    DATA frames in a chunk's encodings."""
    return ("figg", topic)


class TailFeed(Followers[Follower, _Delivery]):
    """One figg topic name's subscribers at the tail, a sink of the partition's tail
    reader; see the module docstring."""

    __slots__ = ("_key", "_members_lag", "_quotas", "_reader", "high_water_mark", "next_seq",
                 "topic")

    def __init__(self, next_seq: int, topic: bytes = b"", reader: TailReader | None = None
                 ) -> None:
        super().__init__()
        #: The Figg topic name (UTF-8) its DATA frames carry.
        self.topic = topic
        self._key = feed_key(topic)
        self._reader = reader
        #: Where the feed delivers next; followers join only here.
        self.next_seq = next_seq
        #: The high-water mark the last delivery saw.
        self.high_water_mark = next_seq - 1
        #: The quotas of the group's members, with how many members have each.
        self._quotas: dict[OutQuota, int] = {}
        #: The reader lag the members last reported (None: not yet).
        self._members_lag: int | None = None

    @classmethod
    def of(cls, topic: bytes) -> Callable[[TailReader], TailFeed]:
        """What makes ``topic``'s feed for a reader (:meth:`TailReader.sink`)."""

        def make(reader: TailReader) -> TailFeed:
            feed = cls(reader.next_seq, topic, reader)
            feed.high_water_mark = reader.high_water_mark
            return feed

        return make

    @property
    def followers(self) -> int:
        return len(self)

    def open_at(self, seq: int) -> bool:
        """Whether a subscriber at ``seq`` may follow now (the feed delivers from there and
        its reader reads)."""
        reader = self._reader
        return seq == self.next_seq and (reader is None or reader.readable)

    async def follow(self, sub: Follower) -> None:
        """Be fed from here on; returns when released (the caller reads on its own then,
        its ``next_seq`` up to date)."""
        released = self.add(sub)
        try:
            await released.wait()
        finally:
            self.unfollow(sub)

    def unfollow(self, sub: Follower) -> None:
        """Stop feeding ``sub`` now (no byte is written for it after this call) and release
        it; its position is up to date after this."""
        released = self.remove(sub)
        if released is not None:
            released.set()

    def deliver(self, frames: bytes, count: int, next_seq: int, high_water_mark: int) -> None:
        """Give every follower the frames of the messages up to ``next_seq - 1``; release
        those whose connection can not take them."""
        piece = (frames, count, next_seq, high_water_mark)
        if self._quotas:
            self._check_quotas()  # (before the slow ones are fed: those it takes out are)
        if self._slow:
            self.feed_slow(piece)
        # Members a pass could not finish leave the group at this delivery's end.
        self.next_seq = next_seq
        self.high_water_mark = high_water_mark
        if self._forms:
            if frames:  # (none: records that are no messages, Kafka control batches)
                self.send_groups(piece)
            lag = high_water_mark - next_seq + 1
            if lag != self._members_lag:  # (rare: at the tail it stays 0)
                self._members_lag = lag
                for member in self.members():
                    member.report_lag(next_seq, high_water_mark)

    # The reader's sink (gateway.tail.reader.TailSink).

    def chunk(self, chunk: TailChunk) -> None:
        """The reader read ``chunk``: its DATA frames (made once per chunk for this topic
        name) to every follower."""
        if not len(self):
            self.next_seq = chunk.next_seq
            self.high_water_mark = chunk.high_water_mark
            return
        try:
            frames = chunk.encoded(self._key, lambda: self._frames(chunk))
        except ProtocolError:
            # The followers read on their own: each meets the error and says so.
            self.release_all()
            self.next_seq = chunk.next_seq
            return
        self.deliver(frames.frames, frames.count, chunk.next_seq, chunk.high_water_mark)

    def _frames(self, chunk: TailChunk) -> DataFrames:
        return data_frames(self.topic, chunk.data, chunk.base_seq, chunk.first_seq)

    def restart(self, seq: int) -> None:
        """The reader starts over at ``seq``: the followers read on their own (each finds
        the log's new bounds)."""
        self.release_all()
        self.next_seq = seq

    def outage(self, reason: str) -> None:
        """The partition can not be read now: the followers read on their own (and wait)."""
        self.release_all()

    def recovered(self) -> None:
        """Nothing to do: subscribers follow again when they reach the tail."""

    def stop(self, reason: str | None = None) -> None:
        """Release every follower (the reader stops)."""
        self.release_all()

    def _check_quotas(self) -> None:
        """Members whose principal has a bytes-out limit now (a reload) are fed one by one
        from now on (each delivery is charged to its bucket there)."""
        if not any(quota.out_limited for quota in self._quotas):
            return
        for member in self.members():
            quota = member.quota
            if quota is not None and quota.out_limited:
                self.settle(member)

    # The engine's hooks (gateway.tail.followers).

    def feed_slow(self, piece: _Delivery) -> None:
        """The followers fed one by one: the engine's loop with its ``_feed`` hook inlined
        (a Figg subscriber whose outbox is busy is fed here at every delivery, and the
        hook's call was a third of this loop's cost)."""
        slow = self._slow
        frames, count, next_seq, high_water_mark = piece
        for sub in list(slow):
            if sub.detached:
                self._release(sub)
            elif (fd := sub.direct_fd()) >= 0:
                del slow[sub]
                self._join(sub, fd)
                self._joined(sub, piece)
            elif not sub.take(frames, count, next_seq, high_water_mark):
                self._release(sub)

    def _encode(self, first: Follower, piece: _Delivery, members: int) -> bytes:
        frames = piece[0]
        first.count_out(piece[1] * members, len(frames) * members)
        return frames

    def _on_queue(self, sub: Follower, callback: Callable[[], None]) -> None:
        sub.on_queue(callback)

    def _forget_on_queue(self, sub: Follower, callback: Callable[[], None]) -> None:
        sub.forget_on_queue(callback)

    def _queue_rest(self, sub: Follower, data: bytes, result: int) -> None:
        sub.queue_rest(data[result:] if result > 0 else data, result > 0)

    def _settled(self, sub: Follower, sent: int) -> None:
        sub.settle(self.next_seq, self.high_water_mark)

    def _joined(self, sub: Follower, piece: _Delivery) -> None:
        quota = sub.quota
        if quota is not None:
            self._quotas[quota] = self._quotas.get(quota, 0) + 1
        sub.report_lag(piece[2], piece[3])

    def _forgotten(self, sub: Follower) -> None:
        quota = sub.quota
        if quota is not None:
            left = self._quotas[quota] - 1
            if left:
                self._quotas[quota] = left
            else:
                del self._quotas[quota]


class TailFeeds:
    """The Figg feeds of a server's tail readers, by Figg topic name (``t`` and ``t/0``
    are two feeds of one reader: their DATA frames differ)."""

    def __init__(self, readers: TailReaders) -> None:
        self.readers = readers

    def get(self, topic: bytes) -> TailFeed | None:
        """The feed of ``topic``, if its partition's reader has one."""
        where = figg_to_tank(topic.decode())
        reader = self.readers.get(where.topic, where.partition)
        found = None if reader is None else reader.find(feed_key(topic))
        return found if isinstance(found, TailFeed) else None
