"""The fan-out loop (``gateway.io._fanout``) against its pure-Python reference, over real
loopback sockets, and a tail's fan-out group around a subscriber that falls back to its
own writer and rejoins.

Each differential check builds the same situation twice (fresh socket pairs: one free,
one with a full buffer, one with a tiny send buffer, one whose peer is gone) and wants
the same outcome from both loops, and that each peer received exactly the bytes the loop
says it sent. With ``FIGTANK_PURE_PYTHON=1`` the package must select the reference; the
comparisons still run whenever the extension can be imported.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.testing

from gateway.http.tail import PartitionTail, TailEvent, events_of
from gateway.io import fanout
from gateway.io.fanout import FanoutGroup, send_each_python
from gateway.io.writer import FrameWriter
from gateway.tail.reader import TailReader
from protocols import native
from protocols.tank.bundle import Message
from tests.io.helpers import tcp_pair

PURE = native.pure_python_requested()
compiled = native.built("gateway.io._fanout")
Loop = Callable[["array[int]", bytes], list[tuple[int, int]]]
LOOPS: list[Loop] = [send_each_python] + ([compiled.send_each] if compiled else [])


def test_the_loop_in_use() -> None:
    """Without FIGTANK_PURE_PYTHON the compiled loop must be built and selected."""
    if PURE:
        assert fanout.send_each is send_each_python
        return
    assert compiled is not None, "gateway.io._fanout does not import: rebuild with pip"
    assert fanout.send_each is compiled.send_each


@contextmanager
def pairs(count: int, *, sndbuf: int | None = None) -> Iterator[list[tuple[socket.socket,
                                                                            socket.socket]]]:
    """``count`` loopback TCP connections ``(sender, receiver)``, the senders
    non-blocking (as the server's are)."""
    listener = socket.create_server(("127.0.0.1", 0))
    made = []
    try:
        for _ in range(count):
            receiver = socket.create_connection(listener.getsockname())
            sender, _ = listener.accept()
            if sndbuf is not None:
                sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            sender.setblocking(False)
            receiver.settimeout(5)
            made.append((sender, receiver))
        yield made
    finally:
        listener.close()
        for sender, receiver in made:
            sender.close()
            receiver.close()


def fill(sock: socket.socket) -> None:
    """Write until ``sock``'s buffers take nothing more."""
    for size in (65536, 4096, 1):
        junk = b"j" * size
        while True:
            try:
                sock.send(junk)
            except BlockingIOError:
                break


def received(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        more = sock.recv(size - len(data))
        assert more, f"EOF after {len(data)} of {size} bytes"
        data += more
    return bytes(data)


def nothing_more(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(5)


def outcome_kind(result: int, size: int) -> str:
    if result < 0:
        return "error"
    return "full" if result == 0 else "partial" if result < size else "?"


@pytest.mark.parametrize("size", [1, 300, 4096])
def test_every_free_socket_gets_all_of_it(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    for loop in LOOPS:
        with pairs(8) as made:
            assert loop(array("i", [s.fileno() for s, _ in made]), data) == []
            assert loop(array("i", [s.fileno() for s, _ in made]), data) == []
            for _, receiver in made:
                assert received(receiver, 2 * size) == data * 2
                assert nothing_more(receiver)


def test_nothing_to_send_or_nobody_to_send_to() -> None:
    for loop in LOOPS:
        with pairs(2) as made:
            assert loop(array("i", [s.fileno() for s, _ in made]), b"") == []
            assert loop(array("i"), b"data") == []
            assert all(nothing_more(r) for _, r in made)


def _mixed(loop: Loop) -> tuple[list[tuple[int, str]], list[bytes], int]:
    """Five senders: free, full, tiny buffer (a large piece: partial), peer gone, free.
    Returns (unfinished (index, kind)), what each live peer got of the piece, size."""
    data = os.urandom(1 << 20)
    with pairs(5) as made:
        for tiny_sender, tiny_receiver in made[1:3]:
            tiny_sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            tiny_receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        gone = made[3][1]
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()  # a RST: the sender's next send fails
        wait_for_the_reset()
        fill(made[1][0])
        fds = array("i", [s.fileno() for s, _ in made])
        unfinished = loop(fds, data)
        results = dict(unfinished)
        got = []
        for index in (0, 2, 4):
            sent = results.get(index, len(data))
            got.append(received(made[index][1], sent) if sent > 0 else b"")
            assert got[-1] == data[:len(got[-1])]
        return [(i, outcome_kind(r, len(data))) for i, r in unfinished], got, len(data)


def wait_for_the_reset() -> None:
    """Let the kernel deliver a RST on loopback."""
    time.sleep(0.05)


def test_full_partial_and_broken_sockets_are_returned_in_order() -> None:
    outcomes = []
    for loop in LOOPS:
        unfinished, got, size = _mixed(loop)
        assert unfinished == [(1, "full"), (2, "partial"), (3, "error")]
        assert len(got[0]) == len(got[2]) == size  # the free ones got it all
        assert 0 < len(got[1]) < size
        outcomes.append(unfinished)
    assert all(o == outcomes[0] for o in outcomes)


def test_a_closed_peer_is_an_error_code_not_a_signal() -> None:
    results = []
    for loop in LOOPS:
        a, b = socket.socketpair()
        a.setblocking(False)
        b.close()
        try:
            results.append(loop(array("i", [a.fileno()]), b"data"))
        finally:
            a.close()
    assert all(r == [(0, -errno.EPIPE)] for r in results)


# ----------------------------------------------------------------------- the group


def test_the_group_accounts_each_members_bytes_when_it_leaves() -> None:
    with pairs(3) as made:
        group: FanoutGroup[str] = FanoutGroup()
        for name, (sender, _) in zip("abc", made, strict=True):
            group.add(name, sender.fileno())
        assert group.send(b"12345") == []
        assert group.remove("b") == 5
        assert group.send(b"678") == []
        fill(made[0][0])
        unfinished = group.send(b"9" * 10)
        assert [(u.member, u.result, u.before) for u in unfinished] == [("a", 0, 8)]
        assert sorted(group.members) == ["c"] and "a" not in group and len(group) == 1
        assert group.remove("c") == 18
        assert group.remove("c") is None
        assert received(made[2][1], 18) == b"12345678" + b"9" * 10
        assert received(made[1][1], 5) == b"12345"
        group.add("b", made[1][0].fileno())
        with pytest.raises(ValueError):
            group.add("b", made[1][0].fileno())


# ------------------------------------------- a tail's group: fall back, catch up, rejoin


class _Follower:
    """A subscriber of the tail writing the events' WebSocket frames, as the listener's."""

    fanout_form = "test"

    def __init__(self, outbox: FrameWriter, next_seq: int) -> None:
        self.outbox = outbox
        self._next_seq = next_seq
        self.delivered = _Count()

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def encode(self, tail: PartitionTail, events: list[TailEvent]) -> bytes:
        return tail.joined("ws", events)

    def push(self, tail: PartitionTail, events: list[TailEvent]) -> bool:
        self.outbox.put_nowait(self.encode(tail, events))
        self._next_seq = events[-1].seq + 1
        self.delivered.inc(len(events))
        return True

    def settle(self, next_seq: int, sent: int) -> None:
        self._next_seq = next_seq
        self.outbox.bytes_sent += sent


class _Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: Any = 1) -> None:
        self.value += n


def _batch(tail: PartitionTail, first: int, count: int, size: int) -> list[TailEvent]:
    messages = []
    for seq in range(first, first + count):
        message = Message(b"%d:" % seq + b"v" * size, None, 1)
        message.seq = seq
        messages.append(message)
    return events_of(tail.topic, tail.partition, messages)


async def test_a_subscriber_falls_back_and_rejoins_with_its_bytes_in_order() -> None:
    """Appends while the client reads nothing (the group's sends stop finishing: the
    rest goes through the subscriber's writer), then while it reads (the writer drains,
    the subscriber joins the group again): the client gets every frame once, in order,
    and the bytes the writer counts are all it got."""
    async with tcp_pair(sndbuf=4096, rcvbuf=4096) as (sender, receiver):
        outbox = FrameWriter(sender, 1 << 30)
        tail = PartitionTail(TailReader("t", 0, 1), 1 << 30)
        follower = _Follower(outbox, 1)
        expected = bytearray()
        seen_in_group = seen_fallback = rejoined = False
        got = bytearray()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(outbox.run)
            await trio.testing.wait_all_tasks_blocked()
            assert tail.follow(follower) is not None
            seq = 1
            for round_ in range(60):
                events = _batch(tail, seq, 1 + round_ % 3, 200 + 37 * round_)
                seq += len(events)
                tail.append(events, seq)
                expected += tail.joined("ws", events)
                fast = tail.in_group(follower)
                seen_in_group |= fast
                if not fast and seen_in_group:
                    seen_fallback = True
                if fast and seen_fallback:
                    rejoined = True
                if round_ >= 20:  # read from here on: the writer drains
                    with trio.move_on_after(0.05):
                        while outbox.queued_bytes:
                            got += await receiver.receive_some(65536)
                await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(10):
                while len(got) < len(expected):
                    got += await receiver.receive_some(65536)
            tail.unfollow(follower)
            nursery.cancel_scope.cancel()
        assert bytes(got) == bytes(expected)
        assert seen_in_group and seen_fallback and rejoined
        assert follower.next_seq == seq
        assert outbox.bytes_sent == len(expected)
        assert follower.delivered.value == seq - 1
