"""The fan-out engine (:mod:`gateway.tail.followers`) over real loopback sockets and real
writers, with followers of two forms on one tail (as a partition's SSE and WebSocket
streams are): each piece is encoded once per form and reaches every follower of that
form, whether through its form's group or its own writer; a follower whose socket can
not take a piece falls back with the rest, in order; one whose writer queues anything
leaves its group before the next piece; a released follower is written nothing more.
Every check is on the bytes each peer received.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import trio
import trio.testing

from gateway.io.writer import FrameWriter
from gateway.tail.followers import FED, RELEASE, Followers
from tests.io.helpers import receive_exactly, tcp_pair


class Sub:
    """A follower over a real writer on a loopback socket."""

    def __init__(self, form: str, outbox: FrameWriter, grouped: bool = True) -> None:
        self.form = form
        self.outbox = outbox
        #: Whether it may join its form's group (False: always fed through its writer).
        self.grouped = grouped
        self.next_seq = 0
        self.sent = 0


class Tail(Followers[Sub, tuple[int, bytes]]):
    """A tail of pieces ``(seq, payload)``; each form frames a payload its own way."""

    def __init__(self) -> None:
        super().__init__()
        self.next_seq = 0
        self.encoded: list[str] = []
        self.counted: dict[str, int] = {}

    def deliver(self, seq: int, payload: bytes) -> None:
        self.next_seq = seq + 1
        self.fan_out((seq, payload))

    def _feed(self, sub: Sub, piece: tuple[int, bytes]) -> int:
        if sub.next_seq > piece[0]:
            return RELEASE
        if sub.grouped and sub.next_seq == piece[0] and sub.outbox.free:
            return sub.outbox.fd
        if sub.outbox.full:
            return RELEASE
        sub.outbox.put_nowait(self.frame(sub.form, piece))
        sub.next_seq = piece[0] + 1
        return FED

    def _form(self, sub: Sub) -> str:
        return sub.form

    @staticmethod
    def frame(form: str, piece: tuple[int, bytes]) -> bytes:
        return b"%s%d:%s;" % (form.encode(), piece[0], piece[1])

    def _encode(self, first: Sub, piece: tuple[int, bytes], members: int) -> bytes:
        self.encoded.append(first.form)
        self.counted[first.form] = self.counted.get(first.form, 0) + members
        return self.frame(first.form, piece)

    def _on_queue(self, sub: Sub, callback: Callable[[], None]) -> None:
        sub.outbox.on_queue(callback)

    def _forget_on_queue(self, sub: Sub, callback: Callable[[], None]) -> None:
        sub.outbox.forget_on_queue(callback)

    def _queue_rest(self, sub: Sub, data: bytes, result: int) -> None:
        sub.outbox.put_nowait(data[result:] if result > 0 else data)

    def _settled(self, sub: Sub, sent: int) -> None:
        sub.next_seq = self.next_seq
        sub.sent += sent


async def _sub(stack: AsyncExitStack, nursery: trio.Nursery, form: str, *,
               grouped: bool = True, limit: int = 1 << 20, rcvbuf: int | None = None,
               sndbuf: int | None = None) -> tuple[Sub, trio.SocketStream]:
    sender, receiver = await stack.enter_async_context(tcp_pair(rcvbuf=rcvbuf, sndbuf=sndbuf))
    outbox = FrameWriter(sender, limit)
    outbox.on_demand(lambda: nursery.start_soon(outbox.run))
    stack.callback(outbox.close)
    return Sub(form, outbox, grouped), receiver


def _payload(i: int) -> bytes:
    return bytes([97 + i % 26]) * 2000


async def test_two_forms_each_encoded_once_a_piece(loop: Any) -> None:
    """Three followers of each of two forms and one of each fed through its own writer:
    every peer receives every piece in its form, in order; each piece is encoded once per
    form (not once per follower), and the groups hold the free followers."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            subs = [await _sub(stack, nursery, form) for form in ("sse", "ws")
                    for _ in range(3)]
            subs += [await _sub(stack, nursery, form, grouped=False) for form in ("sse", "ws")]
            tail = Tail()
            events = [tail.add(sub) for sub, _ in subs]
            pieces = [(i, _payload(i)) for i in range(50)]
            expected = {form: b"".join(Tail.frame(form, p) for p in pieces)
                        for form in ("sse", "ws")}
            got: dict[int, bytes] = {}

            async def reader(i: int, sub: Sub, peer: trio.SocketStream) -> None:
                got[i] = await receive_exactly(peer, len(expected[sub.form]))

            async with trio.open_nursery() as readers:
                for i, (sub, peer) in enumerate(subs):
                    readers.start_soon(reader, i, sub, peer)
                for seq, payload in pieces:
                    tail.deliver(seq, payload)
                    await trio.sleep(0)
            for i, (sub, _) in enumerate(subs):
                assert got[i] == expected[sub.form], (i, sub.form)
            # The first piece finds the grouped ones free: both groups send each piece.
            assert tail.encoded.count("sse") == len(pieces)
            assert tail.encoded.count("ws") == len(pieces)
            assert tail.counted == {"sse": 3 * len(pieces), "ws": 3 * len(pieces)}
            assert tail.grouped == 6 and len(tail) == 8
            assert not any(event.is_set() for event in events)
            for sub, _ in subs[:6]:
                assert tail.in_group(sub)
                assert tail.remove(sub) is not None  # out: settled, its position known
                assert sub.next_seq == len(pieces)
                assert sub.sent == len(expected[sub.form])
            nursery.cancel_scope.cancel()


async def test_a_full_socket_falls_back_in_order_and_is_released_when_behind(loop: Any
                                                                            ) -> None:
    """A follower that never reads, with small buffers: a group pass can not finish it,
    it gets the rest through its writer (in order, after what its socket took), is
    released when the writer is full, and its peer holds exactly the pieces up to its
    position. The other member keeps getting every piece through the group."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            fast, fast_peer = await _sub(stack, nursery, "ws")
            slow, slow_peer = await _sub(stack, nursery, "ws", limit=64 * 1024,
                                         rcvbuf=4096, sndbuf=4096)
            tail = Tail()
            released = tail.add(slow)
            tail.add(fast)
            pieces = [(i, _payload(i) * 2) for i in range(200)]
            expected = b"".join(Tail.frame("ws", p) for p in pieces)
            got = b""

            async def reader() -> None:
                nonlocal got
                got = await receive_exactly(fast_peer, len(expected))

            async with trio.open_nursery() as readers:
                readers.start_soon(reader)
                for seq, payload in pieces:
                    tail.deliver(seq, payload)
                    await trio.sleep(0)
            assert got == expected
            assert released.is_set() and len(tail) == 1 and tail.in_group(fast)
            assert not tail.in_group(slow)
            # Its position is up to date: its peer gets exactly the pieces before it.
            assert 0 < slow.next_seq < len(pieces)
            want = b"".join(Tail.frame("ws", p) for p in pieces[:slow.next_seq])
            assert await receive_exactly(slow_peer, len(want)) == want
            with trio.move_on_after(0.2):
                assert await slow_peer.receive_some(100) == b"never"  # nothing more comes
            nursery.cancel_scope.cancel()


async def test_a_queued_write_takes_a_member_out_and_remove_stops_writes(loop: Any
                                                                         ) -> None:
    """Bytes queued in a member's writer (a heartbeat, an answer) take it out of its group
    at once: the next piece goes behind them through its writer, and it rejoins when its
    writer is free again. A removed follower is written nothing more; release_all sets
    every follower's event."""
    with trio.fail_after(20):
        async with AsyncExitStack() as stack, trio.open_nursery() as nursery:
            a, a_peer = await _sub(stack, nursery, "sse")
            b, b_peer = await _sub(stack, nursery, "sse")
            tail = Tail()
            a_released, b_released = tail.add(a), tail.add(b)
            tail.deliver(0, b"zero")
            assert tail.in_group(a) and tail.in_group(b)
            a.outbox.put_nowait(b": heartbeat\n\n" * 50_000)  # more than a socket takes
            assert not tail.in_group(a) and a.next_seq == 1  # settled on leaving
            tail.deliver(1, b"one")
            assert not tail.in_group(a)
            heartbeats = b": heartbeat\n\n" * 50_000
            want_a = Tail.frame("sse", (0, b"zero")) + heartbeats + Tail.frame("sse", (1, b"one"))
            assert await receive_exactly(a_peer, len(want_a)) == want_a
            await a.outbox.wait_empty()
            await trio.testing.wait_all_tasks_blocked()
            tail.deliver(2, b"two")  # its writer is free again: back in the group
            assert tail.in_group(a)
            assert await receive_exactly(a_peer, len(Tail.frame("sse", (2, b"two")))) == (
                Tail.frame("sse", (2, b"two")))
            tail.remove(b)
            tail.deliver(3, b"three")
            want_b = b"".join(Tail.frame("sse", (i, p)) for i, p in
                              enumerate([b"zero", b"one", b"two"]))
            assert await receive_exactly(b_peer, len(want_b)) == want_b
            with trio.move_on_after(0.2):
                assert await b_peer.receive_some(100) == b"never"  # nothing more comes
            tail.release_all()
            assert a_released.is_set() and not b_released.is_set()
            assert len(tail) == 0 and tail.grouped == 0 and a.next_seq == 4
            nursery.cancel_scope.cancel()
