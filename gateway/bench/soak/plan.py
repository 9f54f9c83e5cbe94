"""What the abusers may do (:class:`Caps`), what each did (:class:`Tally`) and what they
share (:class:`Context`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from gateway.bench.soak.target import Target
from gateway.bench.soak.wire import close, connect, peer_closed

MiB = 1024 * 1024


T = TypeVar("T")


def _cap(default: T, help: str) -> T:
    return field(default=default, metadata={"help": help})


@dataclass
class Caps:
    """Every abuser's footprint; each field is a ``--flag`` of the soak (``_`` -> ``-``).

    The defaults suit a 2-core machine with a few GiB to spare: the abusers' own memory
    stays under ~100 MiB (frames are sent from one shared buffer) and what they can make
    a server hold is bounded by these counts (and by ``--max-server-rss``).
    """

    # 1. descriptors: pipelined Consumes nobody reads
    consume_connections: int = _cap(
        20, "Tank connections pipelining Consumes of the topic's start (its files) at once")
    consume_tail_connections: int = _cap(
        2, "the same, reading its last MiB (in the tail cache: memory, not files)")
    consume_pipeline: int = _cap(1024, "Consumes (1 MiB fetch) each such connection sends")
    consume_hold: float = _cap(10.0, "seconds each such connection stays open unread")
    consume_rounds: int = _cap(10, "times each such connection is opened in all")
    data_mib: int = _cap(
        32, "MiB of data in the topic the Consumes read (more than the tail cache)")
    # 1 and 7. creation
    auto_topics: int = _cap(3000, "topics auto-created by Tank Produce to new names")
    wide_partitions: int = _cap(65530, "partitions of one CreateTopic (0: none)")
    tiny_segment_produces: int = _cap(
        2000, "produces to a topic created with log.segment.bytes=64 (0: no such topic)")
    attach_topics: int = _cap(2000, "new topics one Figg connection ATTACHes to")
    # 2 and 3. memory
    big_frame_rounds: int = _cap(5, "rounds of connections that declare a huge frame")
    big_frame_connections: int = _cap(4, "such connections at once (Tank and Figg in turn)")
    big_frame_mib: int = _cap(64, "frame size they declare (MiB, less 1 KiB)")
    big_frame_send_mib: int = _cap(40, "MiB each sends before closing")
    big_frame_interval: float = _cap(5.0, "seconds between the rounds")
    stall_connections: int = _cap(20, "Figg connections that send part of a frame and stall")
    stall_send_mib: int = _cap(8, "MiB of a 48 MiB frame each sends")
    stall_total: int = _cap(100, "such connections in all (a closed one is replaced)")
    # 4. the metrics listener
    scrapers: int = _cap(4, "back-to-back /metrics scrapers")
    slow_scrapers: int = _cap(6, "slow scrapers (half send slowly, half read slowly)")
    silent_scrapers: int = _cap(100, "connections that ask for /metrics and never read")
    # 5. sequence space
    sparse_rounds: int = _cap(3, "partitions given a sparse bundle at 2^64-3")
    # 8. oddities
    odd_rounds: int = _cap(20, "Figg version-2 PINGs, bare-LF requests, /metrics?x=1 each")

    @classmethod
    def fields(cls) -> list[dataclasses.Field[Any]]:
        return list(dataclasses.fields(cls))

    def scaled(self, factor: float) -> Caps:
        """Every count times ``factor`` (at least 1 where it was at least 1): a quick
        run. Sizes and times stay as they are."""
        changes = {}
        for f in self.fields():
            value = getattr(self, f.name)
            if isinstance(value, int) and not f.name.endswith("mib"):
                changes[f.name] = max(1 if value else 0, int(value * factor))
        return dataclasses.replace(self, **changes)


@dataclass
class Tally:
    """What one abuser did: connections it made, connections it could not make, the ones
    the server closed, and its own figures in ``notes``."""

    name: str
    connections: int = 0
    refused: int = 0
    closed_by_server: int = 0
    sent_bytes: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    #: The exception that ended the abuser early, if one did.
    error: str = ""

    def count(self, key: str, by: int = 1) -> None:
        self.notes[key] = self.notes.get(key, 0) + by


@dataclass
class Context:
    """What every abuser is given."""

    target: Target
    caps: Caps
    #: Stamps the names this run creates (``soak-auto-<run>-7``).
    run: str
    #: A topic with ``caps.data_mib`` of messages, for Consumes.
    data_topic: str
    #: The sequence of its last message (set once it is filled).
    data_last: int = 0

    async def open(self, address: tuple[str, int], tally: Tally) -> trio.SocketStream | None:
        """A new connection counted in ``tally``; None (counted as refused) when the
        server does not take it."""
        try:
            stream = await connect(address)
        except OSError:
            tally.refused += 1
            return None
        tally.connections += 1
        return stream

    async def send(self, stream: trio.SocketStream, data: bytes | memoryview,
                   tally: Tally) -> bool:
        """Send ``data``; False (counted as closed by the server) when it closed."""
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            tally.closed_by_server += 1
            return False
        tally.sent_bytes += len(data)
        return True


async def hold_unread(stream: trio.SocketStream, tally: Tally, seconds: float) -> None:
    """Keep ``stream`` open without reading for ``seconds`` (or until the server closes
    it: counted), then close it."""
    try:
        with trio.move_on_after(seconds):
            while not peer_closed(stream):
                await trio.sleep(0.5)
            tally.closed_by_server += 1
    finally:
        await close(stream)
