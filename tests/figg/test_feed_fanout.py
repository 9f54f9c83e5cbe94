"""A Figg tail feed's fan-out group over real loopback sockets and real writers.

The followers whose sockets are free get each delivery in one pass of
:func:`gateway.io.fanout.send_each` (the compiled loop and its pure-Python reference are
both run: each test is parametrized over the loops that can be imported); one whose
socket can not take a delivery falls back to its own writer with the rest, in order,
and one whose writer queues anything leaves the group before the next delivery. Every
check is on the bytes each peer received.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import trio
import trio.testing

from gateway.figg.feed import TailFeed
from gateway.io.writer import FrameWriter
from protocols.figg.messages import Attached, Detached
from tests.figg.helpers import RawPeer, attach, detach, figg_server, open_test_backend, publish
from tests.figg.test_listener import slow_reader
from tests.io.helpers import receive_exactly, tcp_pair


class Quota:
    """A principal's bytes-out limit, off until a test sets it."""

    def __init__(self) -> None:
        self.out_limited = False


class Sub:
    """A follower over a real writer on a loopback socket, as a Figg subscription is."""

    def __init__(self, outbox: FrameWriter, next_seq: int = 1,
                 quota: Quota | None = None) -> None:
        self.outbox = outbox
        self.next_seq = next_seq
        self.detached = False
        self._quota = quota
        self.counted = [0, 0]
        self.lag: int | None = None

    @property
    def quota(self) -> Quota | None:
        return self._quota

    def take(self, frames: bytes, count: int, next_seq: int, high_water_mark: int) -> bool:
        if self.outbox.full:
            return False
        self.outbox.put_nowait(frames, self)
        self.next_seq = next_seq
        return True

    def direct_fd(self) -> int:
        quota = self._quota
        if self.detached or (quota is not None and quota.out_limited):
            return -1
        return self.outbox.fd if self.outbox.free else -1

    def on_queue(self, callback: Callable[[], None]) -> None:
        self.outbox.on_queue(callback)

    def forget_on_queue(self, callback: Callable[[], None]) -> None:
        self.outbox.forget_on_queue(callback)

    def queue_rest(self, rest: bytes, begun: bool) -> None:
        self.outbox.put_nowait(rest, None if begun else self)

    def settle(self, next_seq: int, high_water_mark: int) -> None:
        self.next_seq = next_seq
        self.report_lag(next_seq, high_water_mark)

    def report_lag(self, next_seq: int, high_water_mark: int) -> None:
        self.lag = high_water_mark - (next_seq - 1)

    def count_out(self, messages: int, size: int) -> None:
        self.counted[0] += messages
        self.counted[1] += size


async def _subscriber(stack: AsyncExitStack, nursery: trio.Nursery, *, limit: int = 1 << 20,
                      rcvbuf: int | None = None, sndbuf: int | None = None,
                      quota: Quota | None = None) -> tuple[Sub, trio.SocketStream]:
    sender, receiver = await stack.enter_async_context(tcp_pair(rcvbuf=rcvbuf, sndbuf=sndbuf))
    outbox = FrameWriter(sender, limit)
    outbox.on_demand(lambda: nursery.start_soon(outbox.run))
    stack.callback(outbox.close)
    return Sub(outbox, quota=quota), receiver


def _batch(i: int, size: int) -> bytes:
    head = b"<%d:" % i
    return head + bytes([i % 251]) * (size - len(head) - 1) + b">"


async def test_followers_get_the_same_bytes_and_a_full_one_falls_back(loop: Any) -> None:
    """Five followers; one never reads and has small buffers: it leaves the group with
    the rest of a delivery queued in its writer, is released when that writer is full, and
    has received exactly the deliveries up to its position, in order. The others get
    every delivery through the group."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            quota = Quota()  # one principal's, no limit set
            fast = [await _subscriber(stack, nursery, quota=quota) for _ in range(4)]
            slow_sub, slow_peer = await _subscriber(stack, nursery, limit=64 * 1024,
                                                    rcvbuf=4096, sndbuf=4096, quota=quota)
            subs = [sub for sub, _ in fast] + [slow_sub]
            feed = TailFeed(1)
            released = []

            async def follow(sub: Sub) -> None:
                await feed.follow(sub)
                released.append(sub)

            for sub in subs:
                nursery.start_soon(follow, sub)
            await trio.testing.wait_all_tasks_blocked()
            assert feed.followers == 5

            batches = [_batch(i, 3000) for i in range(200)]
            expected = b"".join(batches)
            got: list[bytes] = [b""] * len(fast)

            async def reader(i: int, peer: trio.SocketStream) -> None:
                got[i] = await receive_exactly(peer, len(expected))

            async with trio.open_nursery() as readers:
                for i, (_, peer) in enumerate(fast):
                    readers.start_soon(reader, i, peer)
                grouped = []
                for i, data in enumerate(batches):
                    feed.deliver(data, 3, 2 + i, 1 + i)
                    grouped.append(feed.grouped)
                    await trio.sleep(0)  # the readers and writers run
            assert grouped[0] == 5  # all free at first: one pass for all of them
            assert grouped[-1] == 4  # the slow one fell back
            assert got == [expected] * len(fast)
            assert [sub.next_seq for sub, _ in fast] == [1] * 4  # grouped: settled on leaving
            assert released == [slow_sub]
            assert feed._quotas == {quota: 4}  # the members' quota, counted once each
            for sub, _ in fast:
                assert feed.in_group(sub)
            position = slow_sub.next_seq - 1
            assert 1 <= position < len(batches)
            # Exactly the deliveries before its position, in order, nothing more.
            assert await receive_exactly(slow_peer, position * 3000) == b"".join(batches[:position])
            with trio.move_on_after(0.2):
                assert await slow_peer.receive_some(1) == b"", "bytes past its position"
            assert slow_sub.outbox.queued_bytes == 0
            # Counted once a delivery for the members it began with: the fast ones every
            # time, the slow one while it was a member.
            counted = sum(sub.counted[0] for sub in subs)
            assert 3 * (4 * len(batches) + 1) <= counted < 3 * 5 * len(batches)
            feed.stop()
            assert sorted(sub.next_seq for sub, _ in fast) == [201] * 4
            nursery.cancel_scope.cancel()


async def test_a_member_whose_writer_queues_leaves_the_group_first(loop: Any) -> None:
    """A reply its socket does not take at once is queued in the member's writer: the
    member leaves the group then, and the next delivery goes behind that reply."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            sub, peer = await _subscriber(stack, nursery, rcvbuf=4096, sndbuf=4096)
            other, other_peer = await _subscriber(stack, nursery)
            feed = TailFeed(1)
            for s in (sub, other):
                nursery.start_soon(feed.follow, s)
            await trio.testing.wait_all_tasks_blocked()
            first = _batch(1, 100)
            feed.deliver(first, 1, 2, 1)
            assert feed.in_group(sub) and feed.grouped == 2
            reply = b"R" * 500_000  # more than the socket takes at once
            sub.outbox.put_nowait(reply)
            assert not feed.in_group(sub) and feed.in_group(other)
            assert sub.next_seq == 2  # settled when it left
            second = _batch(2, 100)
            feed.deliver(second, 1, 3, 2)
            assert sub.next_seq == 3
            data = await receive_exactly(peer, len(first) + len(reply) + len(second))
            assert data == first + reply + second
            assert await receive_exactly(other_peer, 200) == first + second
            nursery.cancel_scope.cancel()


async def test_unfollow_stops_group_writes_at_once(loop: Any) -> None:
    """A member taken out (a DETACH) is sent nothing more by the group; its position is
    where the feed was."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            (a, a_peer), (b, b_peer) = [await _subscriber(stack, nursery) for _ in range(2)]
            feed = TailFeed(5)
            for s in (a, b):
                s.next_seq = 5
                nursery.start_soon(feed.follow, s)
            await trio.testing.wait_all_tasks_blocked()
            feed.deliver(b"one", 1, 6, 5)
            feed.deliver(b"two", 1, 7, 6)
            assert feed.grouped == 2
            b.detached = True
            feed.unfollow(b)
            assert b.next_seq == 7 and feed.grouped == 1 and feed.followers == 1
            feed.deliver(b"three", 1, 8, 7)
            assert await receive_exactly(a_peer, 11) == b"onetwothree"
            assert await receive_exactly(b_peer, 6) == b"onetwo"
            with trio.move_on_after(0.2):
                assert await b_peer.receive_some(1) == b""
            nursery.cancel_scope.cancel()


async def test_a_member_under_a_new_bytes_out_limit_is_fed_one_by_one(loop: Any) -> None:
    """A reload that gives the principal a bytes-out limit takes its subscriptions out of
    the group at the next delivery (take() charges the bucket)."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            quota = Quota()
            sub, peer = await _subscriber(stack, nursery, quota=quota)
            free, free_peer = await _subscriber(stack, nursery)
            feed = TailFeed(1)
            for s in (sub, free):
                nursery.start_soon(feed.follow, s)
            await trio.testing.wait_all_tasks_blocked()
            feed.deliver(b"a", 1, 2, 1)
            assert feed.in_group(sub)
            quota.out_limited = True
            feed.deliver(b"b", 1, 3, 2)
            assert not feed.in_group(sub) and feed.in_group(free)
            feed.deliver(b"c", 1, 4, 3)
            assert not feed.in_group(sub) and sub.next_seq == 4
            assert await receive_exactly(peer, 3) == b"abc"
            assert await receive_exactly(free_peer, 3) == b"abc"
            nursery.cancel_scope.cancel()



# ------------------------------------------------------------------ through the listener


async def test_many_subscribers_of_one_tail_get_the_same_messages_in_order(
        tmp_path: Any, loop: Any) -> None:
    """Twelve subscribers at the tail of one topic (most fed through the feed's group) and
    one that stops reading: every one gets every message, once, in order; the one that
    stopped reading catches up on its own."""
    with trio.fail_after(30):
        async with open_test_backend(tmp_path, durability="os") as backend, \
                figg_server(backend, subscriber_buffer_bytes=64 * 1024) as server:
            pub = await RawPeer.connect(server)
            await pub.send(publish("fan", 1, b"first"))
            await pub.receive(1)
            peers = [await RawPeer.connect(server) for _ in range(12)]
            slow = await slow_reader(server)
            for peer in [*peers, slow]:
                await peer.send(attach("fan", 1))
                assert await peer.receive_one() == Attached("fan", 1)
            await trio.testing.wait_all_tasks_blocked()
            feed = server.listener.feeds.get(b"fan")
            assert feed is not None and feed.followers == 13  # all follow the reader
            most_grouped = 0
            count = 2000
            for start in range(2, count + 2, 100):
                await pub.send(*(publish("fan", i, b"m%d." % i + b"p" * 1500)
                                 for i in range(start, start + 100)))
                await pub.receive(100)
                for peer in peers:
                    got = await peer.receive(100)
                    assert [(d.offset, d.data) for d in got] == [
                        (i, b"m%d." % i + b"p" * 1500) for i in range(start, start + 100)]
                feed = server.listener.feeds.get(b"fan")
                if feed is not None:
                    most_grouped = max(most_grouped, feed.grouped)
            assert most_grouped >= 6  # the fan-out group did feed them
            got = await slow.receive(count)
            assert [d.offset for d in got] == list(range(2, count + 2))


async def test_detach_and_attach_again_while_fed_by_the_group(tmp_path: Any,
                                                                loop: Any) -> None:
    """ATTACH again reports the position a group member is at; after DETACH nothing more
    of the topic comes (DETACHED is the last of it)."""
    with trio.fail_after(20):
        async with open_test_backend(tmp_path, durability="os") as backend, \
                figg_server(backend) as server:
            pub = await RawPeer.connect(server)
            peers = [await RawPeer.connect(server) for _ in range(3)]
            for peer in peers:
                await peer.send(attach("dt"))
                assert await peer.receive_one() == Attached("dt", 0)
            for seq in range(1, 4):
                await pub.send(publish("dt", seq, b"x%d" % seq))
                await pub.receive(1)
                for peer in peers:
                    assert [d.offset for d in await peer.receive(1)] == [seq]
            feed = server.listener.feeds.get(b"dt")
            assert feed is not None and feed.grouped >= 1
            [sub, *_] = feed.members()
            member = _peer_of(sub, peers)
            await member.send(attach("dt"))
            assert await member.receive_one() == Attached("dt", 3)
            await member.send(detach("dt"))
            assert await member.receive_one() == Detached("dt")
            await pub.send(publish("dt", 4, b"x4"))
            await pub.receive(1)
            for peer in peers:
                if peer is not member:
                    assert [d.offset for d in await peer.receive(1)] == [4]
            with trio.move_on_after(0.3):
                assert await member.receive_one() is None, "DATA after DETACHED"



def _peer_of(sub: Any, peers: list[RawPeer]) -> RawPeer:
    """The client end of a subscription's connection."""
    where = sub._outbox._socket.getpeername()
    [peer] = [p for p in peers if p.stream.socket.getsockname() == where]
    return peer


async def test_group_members_report_the_lag_of_each_delivery(loop: Any) -> None:
    """A member's reader lag is the delivery's: reported when it joins and again whenever
    it differs from the delivery before (at the tail it stays put: nothing to do)."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            (a, a_peer), (b, b_peer) = [await _subscriber(stack, nursery) for _ in range(2)]
            feed = TailFeed(1)
            nursery.start_soon(feed.follow, a)
            await trio.testing.wait_all_tasks_blocked()
            feed.deliver(b"1", 1, 2, 6)  # 5 more in the log than this delivery holds
            assert feed.in_group(a) and a.lag == 5
            b.next_seq = 2
            nursery.start_soon(feed.follow, b)
            await trio.testing.wait_all_tasks_blocked()
            feed.deliver(b"2", 1, 3, 6)
            assert feed.grouped == 2 and (a.lag, b.lag) == (4, 4)
            feed.deliver(b"3456", 4, 7, 6)
            assert (a.lag, b.lag) == (0, 0)
            a.lag = b.lag = None
            feed.deliver(b"7", 1, 8, 7)  # the same lag: not reported again
            assert (a.lag, b.lag) == (None, None)
            assert await receive_exactly(a_peer, 7) == b"1234567"
            assert await receive_exactly(b_peer, 6) == b"234567"
            nursery.cancel_scope.cancel()
