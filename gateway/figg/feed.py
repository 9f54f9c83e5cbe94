"""The subscribers of a Figg topic that keep up, fed by one reader of the log.

Subscribers at the tail of a partition all want the same thing: each append, as soon as
it is durable. Instead of each of them waking up, fetching and converting on its own, the
first to reach the tail *leads* a :class:`TailFeed`: it long-polls the backend once for
everyone, turns each chunk into DATA frames once, and queues the frames on every
follower's outbox. A subscriber that reaches the tail at the feed's position follows it
and sleeps until released. A follower is released (and reads on its own from where it
stands) when its connection falls behind (its outbox is full), when the leader stops
(its connection is gone or behind), or when the feed meets anything but data; the next
one at the tail leads a new feed. Subscribers that are behind read the log on their own,
as before, so a slow client still only makes its own subscriptions lag.
"""

from __future__ import annotations

from typing import Protocol

import trio


class Follower(Protocol):
    """What a feed needs of a subscription."""

    next_seq: int
    detached: bool

    def take(self, frames: bytes, count: int, next_seq: int, high_water_mark: int) -> bool:
        """Queue frames a feed read; False when its connection is too far behind."""


class TailFeed:
    """One figg topic's subscribers at the tail; see the module docstring."""

    __slots__ = ("_followers", "next_seq")

    def __init__(self, next_seq: int) -> None:
        #: Where the feed reads next; followers join only here.
        self.next_seq = next_seq
        self._followers: dict[Follower, trio.Event] = {}

    @property
    def followers(self) -> int:
        return len(self._followers)

    async def follow(self, sub: Follower) -> None:
        """Be fed from here on; returns when released (the caller reads on its own then)."""
        released = self._followers[sub] = trio.Event()
        try:
            await released.wait()
        finally:
            self._followers.pop(sub, None)

    def deliver(self, frames: bytes, count: int, next_seq: int, high_water_mark: int) -> None:
        """Give every follower the frames of the messages up to ``next_seq - 1``; release
        those whose connection can not take them."""
        for sub, released in list(self._followers.items()):
            if sub.detached or not sub.take(frames, count, next_seq, high_water_mark):
                del self._followers[sub]
                released.set()
        self.next_seq = next_seq

    def stop(self) -> None:
        """Release every follower (the leader stops)."""
        followers, self._followers = self._followers, {}
        for released in followers.values():
            released.set()


class TailFeeds:
    """The feeds of one listener, by Figg topic name (``t`` and ``t/0`` are two feeds:
    their DATA frames differ)."""

    def __init__(self) -> None:
        self._feeds: dict[bytes, TailFeed] = {}

    def __len__(self) -> int:
        return len(self._feeds)

    def get(self, topic: bytes) -> TailFeed | None:
        """The feed of ``topic``, if it has one."""
        return self._feeds.get(topic)

    def at(self, topic: bytes, seq: int) -> TailFeed | None:
        """The feed of ``topic`` reading at ``seq``, to follow; None when there is none
        there."""
        feed = self._feeds.get(topic)
        return feed if feed is not None and feed.next_seq == seq else None

    def lead(self, topic: bytes, seq: int) -> TailFeed | None:
        """A new feed of ``topic`` at ``seq`` for the caller to lead; None when ``topic``
        has a feed already (at another position: the caller reads on its own)."""
        if topic in self._feeds:
            return None
        feed = self._feeds[topic] = TailFeed(seq)
        return feed

    def end(self, topic: bytes, feed: TailFeed) -> None:
        """The leader stops: release the followers and forget the feed."""
        feed.stop()
        if self._feeds.get(topic) is feed:
            del self._feeds[topic]
