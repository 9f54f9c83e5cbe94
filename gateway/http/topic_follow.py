"""A several-partition SSE stream at the tail, fed by each partition's shared reader.

A one-partition stream at the end of its partition is a follower of the partition's
:class:`~gateway.http.tail.PartitionTail`: the tail's reader queues each append for it,
and its task sleeps until released. A whole-topic stream does the same for every
partition at once (:class:`TopicFollower`): one :class:`PartitionFollower` per partition
is fed by that partition's reader, in that partition's order; the stream's task wakes
only for a heartbeat or when a partition releases it (it fell behind, the tail failed or
started over), and then goes back to reading batches (:mod:`gateway.http.cursor`) until
every partition is at its end again.

The events' ids are the stream's own (every partition's position, ``0:41,1:17``:
:mod:`gateway.http.positions`), so each event's block is made for the stream, but the
id's other partitions are joined once per batch, not once per event.
"""

from __future__ import annotations

import trio
from prometheus_client import Counter

from gateway.auth.quotas import PrincipalQuota
from gateway.http.cursor import Cursor
from gateway.http.quota import owes, took_out
from gateway.http.session import HttpSession
from gateway.http.tail import PartitionTail, TailEvent
from gateway.io.writer import FrameWriter


class PartitionFollower:
    """One partition of a :class:`TopicFollower`, as its tail sees it."""

    __slots__ = ("cursor", "stream")

    #: Never in a tail's fan-out group: a whole-topic stream's ids are its own.
    fanout_form = None

    def __init__(self, stream: TopicFollower, cursor: Cursor) -> None:
        self.stream = stream
        self.cursor = cursor

    @property
    def next_seq(self) -> int:
        return self.cursor.next_seq

    def push(self, tail: PartitionTail, events: list[TailEvent]) -> bool:
        return self.stream.push(self.cursor, events)


class TopicFollower:
    """The partitions of a whole-topic SSE stream, fed by their tails' readers."""

    __slots__ = ("cursors", "delivered", "outbox", "positions", "quota", "session")

    def __init__(self, cursors: list[Cursor], positions: dict[int, int], outbox: FrameWriter,
                 session: HttpSession, delivered: Counter, quota: PrincipalQuota | None) -> None:
        self.cursors = cursors
        #: The position of every partition (shared with the stream's batch path).
        self.positions = positions
        self.outbox = outbox
        self.session = session
        self.delivered = delivered
        self.quota = quota

    def at_the_end(self) -> bool:
        """Whether every partition is delivered up to its tail's end (and there is room)."""
        return not self.outbox.full and all(
            c.next_seq == c.tail.next_seq and c.tail.failed is None for c in self.cursors)

    def push(self, cursor: Cursor, events: list[TailEvent]) -> bool:
        """Queue ``events`` of ``cursor``'s partition; False when the client is too far
        behind (or over its bytes-out quota) to take them."""
        outbox = self.outbox
        if outbox.full or owes(self.quota):
            return False
        partition = cursor.partition
        positions = self.positions
        before = b",".join(b"%d:%d" % (p, o) for p, o in positions.items() if p < partition)
        after = b",".join(b"%d:%d" % (p, o) for p, o in positions.items() if p > partition)
        head = b"id: " + before + (b"," if before else b"")
        tail = (b"," + after if after else b"") + b"\n"
        this = b"%d:%%d" % partition
        data = b"".join([head + this % event.seq + tail + event.sse_data()
                         for event in events])
        outbox.put_parts_nowait(self.session.chunk_parts(data))
        took_out(self.quota, len(data))
        last = events[-1].seq
        positions[partition] = last
        cursor.next_seq = last + 1
        self.delivered.inc(len(events))
        return True

    async def follow(self, heartbeat: float) -> None:
        """Be fed by the tails until one partition releases the stream; a heartbeat every
        ``heartbeat`` seconds."""
        released = trio.Event()
        followers = [(c.tail, PartitionFollower(self, c)) for c in self.cursors]
        try:
            for tail, follower in followers:
                if tail.follow(follower, released) is None:
                    return  # appended meanwhile: read it as a batch first
            while not released.is_set():
                with trio.move_on_after(heartbeat):
                    await released.wait()
                if not released.is_set() and not self.outbox.full:
                    self.outbox.put_nowait(self.session.chunk(b": heartbeat\n\n"))
        finally:
            for tail, follower in followers:
                tail.unfollow(follower)
