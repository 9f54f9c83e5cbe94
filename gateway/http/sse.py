"""``GET /topics/{topic}/events``: a topic (or ``?partition=`` one partition) as Server-Sent
Events.

Each message is an event whose ``data`` is the message's JSON and whose ``id`` is the
position after it (:mod:`gateway.http.positions`); an EventSource that reconnects sends it
back as ``Last-Event-ID`` and gets every later message exactly once, in order per
partition. The stream starts with ``retry: 1000`` and sends a comment line every
``http.heartbeat_secs`` it has nothing else to send.

A subscriber that keeps up is served from the partitions' shared tails (each event
encoded once for all), and at the end of every partition it streams is fed by the tails'
readers (a whole topic: :mod:`gateway.http.topic_follow`); one behind reads the log on
its own. One that falls behind by more
than ``http.subscriber_buffer_bytes`` while live, or whose socket takes nothing for
``limits.idle_timeout_secs``, is closed (``slow``): its last event id says where to
resume, and the server keeps nothing for it.

A stream whose access a reload revokes ends after an ``event: revoked``, one admitted with
a JWT that expires after an ``event: expired`` (:mod:`gateway.http.revocation`).

Events count against the principal's bytes-out quota; while it is in debt no event is
made for the stream (:mod:`gateway.http.quota`).
"""

from __future__ import annotations

import math
from typing import Final

import h11
import trio
from prometheus_client import Counter

from gateway.auth.policy import Operation
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota
from gateway.core.contract import ensure_available
from gateway.http.auth import (
    access_of,
    bearer_token,
    check_topic_name,
    partition_param,
    partitions_of,
    require,
)
from gateway.http.cursor import (
    Behind,
    Cursor,
    Gone,
    Unavailable,
    next_batch,
    wait_for_room,
)
from gateway.http.outage import sse_available, sse_unavailable
from gateway.http.positions import event_id, from_last_event_id, from_parameter
from gateway.http.quota import owes, quota_of, took_out, wait_out
from gateway.http.request import Request
from gateway.http.revocation import expired_event, revoked_event
from gateway.http.session import SOCKET_ERRORS, HttpSession
from gateway.http.tail import PartitionTail, TailEvent
from gateway.http.topic_follow import TopicFollower
from gateway.io.writer import FrameWriter

#: Bytes of events sent in one write.
WRITE_BYTES: Final = 256 * 1024
_HEAD = [(b"content-type", b"text/event-stream; charset=utf-8"),
         (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


async def events(session: HttpSession, request: Request) -> None:
    topic = request.params["topic"]
    check_topic_name(topic)
    access = access_of(session, request)
    require(access, topic, Operation.SUBSCRIBE, "events")
    token = bearer_token(request)
    listener = session.listener
    ensure_available(session.listener.backend)
    infos = await partitions_of(session, access, topic, "events")
    one = partition_param(request.query.get("partition"), len(infos), topic)
    partitions = [one] if one is not None else list(range(len(infos)))
    last_id = request.header("last-event-id") or request.query.get("last_event_id")
    if last_id:
        starts = from_last_event_id(last_id, partitions, infos)
    else:
        starts = await from_parameter(request.query.get("from", ""), listener.backend,
                                      topic, partitions, infos)
    settings = listener.settings
    tails = [listener.tails.acquire(topic, p, infos[p].high_water_mark + 1)
             for p in partitions]
    cursors = [Cursor(listener.backend, tail, starts[tail.partition],
                      settings.subscriber_buffer_bytes) for tail in tails]
    headers = list(_HEAD)
    listener.cors.apply(request, headers)
    request.headers.clear()  # read: an idle stream keeps no more of its request
    session.accesses.clear()  # nor the policy's cached answers
    listener.streams["sse"] += 1
    try:
        await session.start_stream(200, headers)
        with quota_of(session, access.principal) as quota:
            await _stream(session, topic, cursors, single=len(partitions) == 1,
                          admitted=_Admitted(session, topic, access.principal, token),
                          quota=quota)
    finally:
        listener.streams["sse"] -= 1
        for tail in tails:
            listener.tails.release(tail)


class _Follower:
    """A one-partition stream at the tail, fed by the tail's reader (no wake-up of its own
    task per message; while its socket is free, through the tail's fan-out group)."""

    __slots__ = ("cursor", "delivered", "outbox", "quota", "session")

    def __init__(self, cursor: Cursor, outbox: FrameWriter, session: HttpSession,
                 delivered: Counter, quota: PrincipalQuota | None = None) -> None:
        self.cursor = cursor
        self.outbox = outbox
        self.session = session
        self.delivered = delivered
        self.quota = quota

    @property
    def next_seq(self) -> int:
        return self.cursor.next_seq

    @property
    def fanout_form(self) -> str | None:
        """Every one-partition stream of a tail sends the same bytes (chunked, as h11
        frames them); one whose principal has a bytes-out quota counts each write."""
        quota = self.quota
        return "sse" if quota is None or not quota.out_limited else None

    def encode(self, tail: PartitionTail, events: list[TailEvent]) -> bytes:
        return tail.joined("sse", events, self.session.chunk)

    def push(self, tail: PartitionTail, events: list[TailEvent]) -> bool:
        if self.outbox.full or owes(self.quota):
            return False
        data = self.encode(tail, events)
        self.outbox.put_nowait(data)
        took_out(self.quota, len(data))
        self.cursor.next_seq = events[-1].seq + 1
        self.delivered.inc(len(events))
        return True

    def settle(self, next_seq: int, sent: int) -> None:
        self.cursor.next_seq = next_seq
        self.outbox.bytes_sent += sent


async def _follow(follower: _Follower, heartbeat: float) -> None:
    """Be fed by the tail until released; a heartbeat every ``heartbeat`` seconds."""
    tail = follower.cursor.tail
    released = tail.follow(follower)
    if released is None:
        return
    try:
        while not released.is_set():
            with trio.move_on_after(heartbeat):
                await released.wait()
            if not released.is_set() and not follower.outbox.full:
                follower.outbox.put_nowait(follower.session.chunk(b": heartbeat\n\n"))
    finally:
        tail.unfollow(follower)


class _Admitted:
    """What let the stream in, for :class:`~gateway.http.revocation.OpenStreams` to look
    at again on a reload."""

    __slots__ = ("ending", "outbox", "principal", "reason", "scope", "session", "token",
                 "topic")
    kind = "sse"

    def __init__(self, session: HttpSession, topic: str, principal: Principal, token: str | None
                 ) -> None:
        self.session = session
        self.topic = topic
        self.principal = principal
        self.token = token
        #: Why access was revoked (or its token expired), once it was.
        self.reason: str | None = None
        #: How the connection's end is logged then: ``access_revoked``, ``token_expired``.
        self.ending = "access_revoked"
        self.outbox: FrameWriter | None = None
        self.scope: trio.CancelScope | None = None

    def topics(self) -> tuple[str]:
        return (self.topic,)

    def revoke(self, reason: str, *, expired: bool = False) -> None:
        self.reason = reason
        if expired:
            self.ending = "token_expired"
        if self.outbox is not None:
            session = self.session
            last = expired_event(reason) if expired else revoked_event(reason)
            self.outbox.put_nowait(session.chunk(last)
                                   + (session.conn.send(h11.EndOfMessage()) or b""))
        if self.scope is not None:
            self.scope.cancel()


async def _stream(session: HttpSession, topic: str, cursors: list[Cursor], *, single: bool,
                  admitted: _Admitted, quota: PrincipalQuota | None = None) -> None:
    listener = session.listener
    settings = listener.settings
    stall = listener.limits.idle_timeout_secs or math.inf
    heartbeat = settings.heartbeat_secs
    delivered = listener.metrics.for_topic(listener.metrics.messages_out, topic)
    positions = {c.partition: c.position for c in cursors}
    outbox = FrameWriter(session.stream, settings.subscriber_buffer_bytes)
    outbox.put_nowait(session.chunk(b"retry: 1000\n: " + event_id(positions) + b"\n\n"))
    follower = _Follower(cursors[0], outbox, session, delivered, quota) if single else None
    whole = None if single else TopicFollower(cursors, positions, outbox, session, delivered,
                                              quota)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_write, outbox, nursery.cancel_scope, session)
        admitted.outbox = outbox
        with session.cancellable() as scope, listener.open_streams.holding(admitted):
            admitted.scope = scope
            listener.open_streams.watch_expiry(admitted, nursery)
            try:
                while True:
                    await wait_out(quota)
                    if follower is not None and not outbox.full and (
                            follower.next_seq == follower.cursor.tail.next_seq):
                        await _follow(follower, heartbeat)
                    elif whole is not None and whole.at_the_end():
                        await whole.follow(heartbeat)
                    await wait_for_room(outbox, stall)
                    try:
                        batch = await next_batch(cursors, WRITE_BYTES, heartbeat)
                    except Unavailable as exc:
                        await _outage(session, outbox, cursors, positions, single,
                                      str(exc), heartbeat)
                        continue
                    if not batch:
                        outbox.put_nowait(session.chunk(b": heartbeat\n\n"))
                        continue
                    count = 0
                    for cursor, found in batch:
                        count += len(found)
                        if single:
                            data = cursor.tail.joined("sse", found, session.chunk)
                            outbox.put_nowait(data)
                            took_out(quota, len(data))
                            continue
                        else:
                            parts = []
                            for event in found:
                                positions[cursor.partition] = event.seq
                                parts.append(b"id: " + event_id(positions) + b"\n"
                                             + event.sse_data())
                            data = b"".join(parts)
                        outbox.put_parts_nowait(session.chunk_parts(data))
                        took_out(quota, len(data))
                    delivered.inc(count)
            except Behind as exc:
                listener.metrics.limit_hit(exc.limit)
                session.ended("slow", str(exc))
            except Gone as exc:
                session.ended("topic_gone", str(exc))
        if admitted.reason is not None:
            session.ended(admitted.ending, admitted.reason)
            with trio.move_on_after(1):  # let the last event out
                await outbox.wait_empty()
        elif scope.cancelled_caught:
            session.ended("shutdown", "server shutting down")
        nursery.cancel_scope.cancel()
    session.bytes_sent += outbox.bytes_sent


async def _outage(session: HttpSession, outbox: FrameWriter, cursors: list[Cursor],
                  positions: dict[int, int], single: bool, reason: str, heartbeat: float
                  ) -> None:
    """The stream's partitions can not be read now: ``event: unavailable`` once, heartbeats
    while it lasts, ``event: available`` when every partition can be read again; the
    stream goes on from where it was."""
    outbox.put_nowait(session.chunk(sse_unavailable(reason)))

    def beat() -> None:
        if not outbox.full:
            outbox.put_nowait(session.chunk(b": heartbeat\n\n"))

    for cursor in cursors:
        await cursor.until_available(heartbeat, beat)
    last = (str(cursors[0].position) if single
            else event_id(positions).decode())
    outbox.put_nowait(session.chunk(sse_available(last)))


async def _write(outbox: FrameWriter, scope: trio.CancelScope, session: HttpSession) -> None:
    """The stream's writer task; a broken socket ends the stream."""
    try:
        await outbox.run()
    except SOCKET_ERRORS:
        session.ended("reset", "connection broken")
        scope.cancel()
