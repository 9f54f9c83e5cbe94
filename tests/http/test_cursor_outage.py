"""Cursors of a whole-topic stream across an outage of one of its partitions: what was
taken from the other partitions' buffers is delivered, never skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.backend.embedded import EmbeddedSettings, open_embedded_backend
from gateway.core.config import Settings
from gateway.core.contract import ensure_topic
from gateway.core.metrics import Metrics
from gateway.http.cursor import Cursor, Unavailable, next_batch
from gateway.http.tail import PartitionTail, Tails, events_of
from gateway.tail.reader import WATCH_SECS, TailReader, TailReaders
from protocols.tank.bundle import Message


async def test_a_batch_taken_before_another_partition_is_unavailable_is_not_lost(
        tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", durability="os")
    with trio.fail_after(10):
        async with open_embedded_backend(EmbeddedSettings.of(settings), Metrics()) as backend:
            buffered = _tail(TailReader("t", 0, 1))
            away_reader = TailReader("t", 1, 1)
            away = _tail(away_reader)
            buffered.append(events_of("t", 0, [Message(b"m%d" % i, seq=i)
                                               for i in (1, 2, 3)]), 4)
            away_reader.outage("upstream away")
            cursors = [Cursor(backend, buffered, 1, 1 << 20),
                       Cursor(backend, away, 1, 1 << 20)]
            batch = await next_batch(cursors, 1 << 20, 1.0)
            assert [(c.partition, [e.seq for e in found]) for c, found in batch] == [
                (0, [1, 2, 3])]
            assert cursors[0].next_seq == 4
            # Nothing else to deliver: now the outage is told.
            with pytest.raises(Unavailable):
                await next_batch(cursors, 1 << 20, 1.0)
            assert cursors[0].next_seq == 4


async def test_a_long_outage_keeps_one_waker_per_waiting_subscriber(tmp_path: Path) -> None:
    """A subscriber waiting out an outage with a heartbeat every few seconds (an SSE
    stream) registers one waker with the tail, not one more per heartbeat: a day-long
    outage must not pile up an event per stream per heartbeat."""
    settings = Settings(data_dir=tmp_path / "data", durability="os")
    with trio.fail_after(10):
        async with open_embedded_backend(EmbeddedSettings.of(settings), Metrics()) as backend:
            reader = TailReader("t", 0, 1)
            tail = _tail(reader)
            reader.outage("upstream away")
            cursor = Cursor(backend, tail, 1, 1 << 20)
            beats = []
            ten_beats = trio.Event()

            def beat() -> None:
                beats.append(1)
                if len(beats) == 10:
                    ten_beats.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cursor.until_available, 0.01, beat)
                # Counted, not timed: a busy machine gives the waiter fewer beats a second.
                await ten_beats.wait()
                assert len(tail._wakers) == 1
                reader.recovered()
            assert len(tail._wakers) == 0


async def test_a_tail_marked_unavailable_while_the_upstream_is_up_recovers_at_once(
        tmp_path: Path) -> None:
    """A read begun in an outage may fail after the watcher saw the upstream come back,
    marking its tail again: the next look of the watcher, not the reader's next long poll
    (up to 30 s later), tells the subscribers it is available."""
    settings = Settings(data_dir=tmp_path / "data", durability="os")
    with trio.fail_after(10):
        async with open_embedded_backend(EmbeddedSettings.of(settings), Metrics()) as backend:
            backend.has_upstream = True  # type: ignore[misc]  # an upstream that is up
            await ensure_topic(backend, "t")
            readers = TailReaders(backend)
            tails = Tails(readers, 1 << 20)
            async with trio.open_nursery() as nursery:
                await nursery.start(readers.run)
                tail = tails.acquire("t", 0, 1)
                await trio.sleep(0.1)  # its reader waits in a long poll at the end
                tail.reader.outage("the upstream connection broke")
                await trio.sleep(3 * WATCH_SECS)
                assert tail.failed is None
                assert tail.unavailable is None
                nursery.cancel_scope.cancel()


def _tail(reader: TailReader) -> PartitionTail:
    """The HTTP tail of ``reader``, as a listener's :class:`Tails` makes it."""
    return reader.sink(PartitionTail.key(1 << 20), PartitionTail.of(1 << 20))
