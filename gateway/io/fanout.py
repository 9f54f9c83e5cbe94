"""The same bytes to many subscribers' sockets in one call: the fast path of a fan-out.

Subscribers at the tail of a stream all get the same bytes (the events encoded and
framed once). A :class:`FanoutGroup` holds the descriptors of those whose sockets are
free (nothing queued for them in their own writer) and sends each new piece to all of
them with :func:`send_each`: one non-blocking ``send()`` per descriptor in a compiled loop
(:mod:`gateway.io._fanout`), no Python and no task wake-up per subscriber. The members it
could not finish (a full socket buffer, a partial write, an error) leave the group with
how much they took; their owner queues the rest in the member's own writer, whose task
waits for the socket and meets any error, and puts them back in the group once that
writer is idle again. What each member was sent through the group is accounted when it
leaves, not per send.

``FIGTANK_PURE_PYTHON=1`` selects :func:`send_each_python`, the reference the compiled
loop is tested against.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from protocols.native import compiled


def send_each_python(fds: Sequence[int], data: bytes) -> list[tuple[int, int]]:
    """Send ``data`` on each of ``fds`` without waiting; ``(index, result)`` for each one
    not sent all of it, in order: ``result`` is the bytes it took (0: its buffer was full)
    or ``-errno`` on an error.

    The reference of the compiled loop: ``os.write`` on a non-blocking socket is its
    ``send()`` (the interpreter ignores SIGPIPE, so a closed peer is ``EPIPE``).
    """
    size = len(data)
    unfinished: list[tuple[int, int]] = []
    if not size:
        return unfinished
    for index, fd in enumerate(fds):
        try:
            sent = os.write(fd, data)
        except BlockingIOError:
            unfinished.append((index, 0))
            continue
        except OSError as exc:
            unfinished.append((index, -(exc.errno or 1)))
            continue
        if sent < size:
            unfinished.append((index, sent))
    return unfinished


if TYPE_CHECKING:
    from gateway.io import _fanout as _native  # its .pyi; None at run time when not built
else:
    _native = compiled("gateway.io._fanout")
#: The loop in use: compiled when built and not disabled.
send_each: Callable[[array[int], bytes], list[tuple[int, int]]] = (
    _native.send_each if _native is not None else send_each_python)

M = TypeVar("M")


class Unfinished(NamedTuple, Generic[M]):
    """A member a send could not finish; it has left the group."""

    member: M
    #: Bytes of the piece it took (0 when none), or ``-errno``.
    result: int
    #: Bytes it was sent through the group before this piece.
    before: int


class FanoutGroup(Generic[M]):
    """Members (each with its socket's descriptor) that get the same bytes together."""

    __slots__ = ("_fds", "_members", "_slots", "_starts", "sent")

    def __init__(self) -> None:
        self._fds: array[int] = array("i")
        self._members: list[M] = []
        #: Each member's index in ``_members`` and ``_fds``.
        self._slots: dict[M, int] = {}
        #: :attr:`sent` when each member joined.
        self._starts: list[int] = []
        #: Bytes sent to every member of the group since it was made.
        self.sent = 0

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, member: object) -> bool:
        return member in self._slots

    @property
    def members(self) -> list[M]:
        """A copy of the members, in no particular order."""
        return list(self._members)

    def first(self) -> M:
        """One member (IndexError when none)."""
        return self._members[0]

    def add(self, member: M, fd: int) -> None:
        """Send ``member`` (writing on ``fd``, a non-blocking socket) the next pieces."""
        if member in self._slots:
            raise ValueError("already a member")
        self._slots[member] = len(self._members)
        self._members.append(member)
        self._fds.append(fd)
        self._starts.append(self.sent)

    def remove(self, member: M) -> int | None:
        """Take ``member`` out; the bytes it was sent through the group (None when it
        was not a member)."""
        index = self._slots.pop(member, None)
        if index is None:
            return None
        sent = self.sent - self._starts[index]
        last = len(self._members) - 1
        if index != last:
            moved = self._members[last]
            self._members[index] = moved
            self._fds[index] = self._fds[last]
            self._starts[index] = self._starts[last]
            self._slots[moved] = index
        self._members.pop()
        self._fds.pop()
        self._starts.pop()
        return sent

    def send(self, data: bytes) -> list[Unfinished[M]]:
        """Send ``data`` to every member; the members not sent all of it, taken out of
        the group (the others have it all)."""
        if not self._members or not data:
            return []
        unfinished = send_each(self._fds, data)
        out = []
        # From the highest index down: removing one moves the last member into its slot.
        for index, result in reversed(unfinished):
            member = self._members[index]
            before = self.sent - self._starts[index]
            self.remove(member)
            out.append(Unfinished(member, result, before))
        self.sent += len(data)
        out.reverse()
        return out
