"""The followers of one tail: subscribers fed by the tail's reader, not by tasks of their own.

Subscribers at the tail of a stream all want the same thing: each new piece (a chunk of
appends) as soon as it is there. A :class:`Followers` holds those a tail's reader feeds
itself: each delivery (:meth:`Followers.fan_out`) goes to every follower with no task
wake-up per follower. Followers whose sockets are free (nothing queued in their own
writer) are members of a :class:`~gateway.io.fanout.FanoutGroup`, one per *form* (the
bytes a protocol sends for a piece: Figg DATA frames of one topic name, an SSE block, a
WebSocket frame): the piece is encoded once per form and written to every member's
socket in one compiled pass (:func:`gateway.io.fanout.send_each`). The members a pass
could not finish leave their group and get the rest through their own writer, in order;
a member also leaves its group the moment anything is queued in its writer (an answer,
a heartbeat: :meth:`Followers.settle`, the writer's on-queue callback), so nothing the
group writes can overtake it. The others are fed one by one and join a group at a
delivery that finds their socket free. A follower that can not take a delivery (its
client is behind) is *released*: its event is set, and it reads on its own from where it
stands.

What differs between protocols is a handful of small steps, the hooks a subclass
implements: whether a follower joins a group now or is fed by itself
(:meth:`Followers._feed`), encoding a piece in a form and counting what a group was
sent (:meth:`Followers._encode`), queueing the rest a pass did not write, and bringing a
follower's position up to date when it leaves its group (:meth:`Followers._settled`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import partial
from typing import Final, Generic, TypeVar

import trio

from gateway.io.fanout import FanoutGroup

__all__ = ["FED", "RELEASE", "Followers"]

F = TypeVar("F")
P = TypeVar("P")

#: :meth:`Followers._feed`: the follower took the piece through its own writer.
FED: Final = -1
#: :meth:`Followers._feed`: the follower can not take the piece: release it (it reads on
#: its own from where it stands).
RELEASE: Final = -2


class Followers(Generic[F, P]):
    """The followers of one tail, fed pieces of type ``P``; see the module docstring."""

    __slots__ = ("_followers", "_forms", "_groups", "_hooks", "_slow")

    def __init__(self) -> None:
        #: Every follower, and the event that releases it.
        self._followers: dict[F, trio.Event] = {}
        #: The followers fed one by one (the others are in a group).
        self._slow: dict[F, None] = {}
        #: The followers fed with one compiled pass, by form.
        self._groups: dict[Hashable, FanoutGroup[F]] = {}
        #: The form (group) of each member.
        self._forms: dict[F, Hashable] = {}
        #: The callback each member left with its writer.
        self._hooks: dict[F, Callable[[], None]] = {}

    # -- the hooks -------------------------------------------------------------------

    def _feed(self, follower: F, piece: P) -> int:
        """At a delivery, for a follower fed one by one: the descriptor of its socket when
        it joins its form's group now (``piece`` then goes to it through the group), or
        :data:`FED` (it took ``piece`` through its own writer), or :data:`RELEASE` (it
        can not take it: nothing was queued). One call a follower: this is the path that
        costs Python per follower."""
        raise NotImplementedError

    def _form(self, follower: F) -> Hashable:
        """The form of ``follower``'s bytes (its group); one form unless overridden."""
        return None

    def _encode(self, first: F, piece: P, members: int) -> bytes:
        """``piece`` in the form of ``first``'s group, as every member of it is sent;
        count it sent to ``members`` members."""
        raise NotImplementedError

    def _on_queue(self, follower: F, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time bytes are queued in ``follower``'s
        writer (not written at once) or the writer closes."""
        raise NotImplementedError

    def _forget_on_queue(self, follower: F, callback: Callable[[], None]) -> None:
        """Forget a callback left with :meth:`_on_queue`."""
        raise NotImplementedError

    def _queue_rest(self, follower: F, data: bytes, result: int) -> None:
        """Queue in ``follower``'s writer what a group pass did not write of ``data``
        (``result``: the bytes it took, 0 when none, or ``-errno``)."""
        raise NotImplementedError

    def _settled(self, follower: F, sent: int) -> None:
        """``follower`` left its group, having been sent ``sent`` bytes through it and
        every delivery before the tail's position: bring its position up to date."""

    def _joined(self, follower: F, piece: P) -> None:
        """``follower`` joined its group at the delivery of ``piece``."""

    def _forgotten(self, follower: F) -> None:
        """``follower`` is out of its group now."""

    # -- the engine ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._followers)

    @property
    def grouped(self) -> int:
        """Followers fed through a fan-out group now."""
        return len(self._forms)

    def in_group(self, follower: F) -> bool:
        """Whether ``follower`` is fed through a fan-out group now."""
        return follower in self._forms

    def group(self, form: Hashable = None) -> FanoutGroup[F]:
        """The fan-out group of ``form`` (made empty when it has none)."""
        group = self._groups.get(form)
        if group is None:
            group = self._groups[form] = FanoutGroup()
        return group

    def members(self) -> list[F]:
        """Every member of every group now."""
        return list(self._forms)

    def add(self, follower: F, released: trio.Event | None = None) -> trio.Event:
        """Feed ``follower`` from the next delivery on (fed one by one until a delivery
        finds its socket free); the event set when it is released (``released``, when
        given: one event may release followers of several tails)."""
        if released is None:
            released = trio.Event()
        self._followers[follower] = released
        self._slow[follower] = None
        return released

    def remove(self, follower: F) -> trio.Event | None:
        """Stop feeding ``follower`` now (no byte is written for it after this call; its
        position is up to date); its release event, not set, or None when it was not a
        follower."""
        released = self._followers.pop(follower, None)
        if released is None:
            return None
        if follower in self._slow:
            del self._slow[follower]
        else:
            self._leave(follower)
        return released

    def release_all(self) -> None:
        """Release every follower (their positions up to date)."""
        for member in list(self._forms):
            self._leave(member)
        self._slow.clear()
        followers, self._followers = self._followers, {}
        for released in followers.values():
            released.set()

    def settle(self, follower: F) -> None:
        """``follower`` is fed one by one from now on (out of its group, its position up
        to date; it joins again at a delivery that finds its socket free). Its writer's
        on-queue callback: what is queued there must go out before the group writes to
        its socket again."""
        self._leave(follower)
        if follower in self._followers:
            self._slow[follower] = None

    def fan_out(self, piece: P) -> None:
        """Give every follower ``piece``: :meth:`feed_slow`, then :meth:`send_groups`."""
        if self._slow:
            self.feed_slow(piece)
        if self._forms:
            self.send_groups(piece)

    def feed_slow(self, piece: P) -> None:
        """The followers fed one by one: each joins its group, takes ``piece`` or is
        released."""
        slow = self._slow
        feed = self._feed
        for follower in list(slow):
            fd = feed(follower, piece)
            if fd >= 0:
                del slow[follower]
                self._join(follower, fd)
                self._joined(follower, piece)
            elif fd == RELEASE:
                self._release(follower)

    def send_groups(self, piece: P) -> None:
        """Send ``piece`` to every group's members, encoded once per form, in one call a
        group; the members a call could not finish get the rest through their writers."""
        # (No group is made while sending: a member leaving only leaves its group.)
        for group in self._groups.values():
            if not len(group):
                continue
            data = self._encode(group.first(), piece, len(group))
            for member, result, before in group.send(data):
                self._forget(member)
                self._slow[member] = None
                self._settled(member, before + max(result, 0))
                self._queue_rest(member, data, result)

    def _release(self, follower: F) -> None:
        del self._slow[follower]
        self._followers.pop(follower).set()

    def _join(self, follower: F, fd: int) -> None:
        form = self._form(follower)
        self.group(form).add(follower, fd)
        self._forms[follower] = form
        hook = self._hooks[follower] = partial(self.settle, follower)
        self._on_queue(follower, hook)

    def _leave(self, follower: F) -> bool:
        form = self._forms.get(follower, self)
        if form is self:
            return False
        sent = self._groups[form].remove(follower)
        assert sent is not None
        self._forget(follower)
        self._settled(follower, sent)
        return True

    def _forget(self, follower: F) -> None:
        """What was kept for ``follower`` as a member (it is out of its group now)."""
        del self._forms[follower]
        self._forget_on_queue(follower, self._hooks.pop(follower))
        self._forgotten(follower)
