"""The frame writer on a real loopback connection: order, lanes, budget, file chunks."""

from __future__ import annotations

import os

import pytest
import trio

from gateway.io.writer import FrameWriter, ShortChunk
from tests.io.helpers import FileRange, receive_exactly, reset, tcp_pair


async def written(writer: FrameWriter, receiver: trio.SocketStream, size: int) -> bytes:
    """Run ``writer`` until ``size`` bytes arrived and its queue is empty; those bytes."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        data = await receive_exactly(receiver, size)
        await writer.wait_empty()
        nursery.cancel_scope.cancel()
    return data


class Sub:
    def __init__(self) -> None:
        self.detached = False


async def test_urgent_frames_overtake_the_ordered_queue_in_one_write() -> None:
    async with tcp_pair() as (sender, receiver):
        writer = FrameWriter(sender)
        sub = Sub()
        writer.put_nowait(b"ATTACHED;")
        writer.put_nowait(b"DATA1;", sub)
        writer.put_urgent(b"PONG;")
        writer.put_nowait(b"DATA2;", sub)
        writer.put_urgent(b"ACK;")
        assert writer.queued_bytes == 30
        assert await written(writer, receiver, 30) == b"PONG;ACK;ATTACHED;DATA1;DATA2;"
        assert writer.bytes_sent == 30 and writer.queued_bytes == 0


async def test_an_idle_writer_lets_a_put_write_at_once() -> None:
    async with tcp_pair() as (sender, receiver):
        writer = FrameWriter(sender)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.testing.wait_all_tasks_blocked()
            writer.put_nowait(b"reply")
            # Written by the put itself: nothing queued, no task woken.
            assert writer.bytes_sent == 5 and writer.queued_bytes == 0
            assert await receive_exactly(receiver, 5) == b"reply"
            nursery.cancel_scope.cancel()


async def test_without_direct_writes_a_burst_is_queued_for_the_writer_task() -> None:
    async with tcp_pair() as (sender, receiver):
        writer = FrameWriter(sender, direct=False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(100):
                writer.put_nowait(b"%03d" % i)
            assert writer.bytes_sent == 0 and writer.queued_bytes == 300
            data = await receive_exactly(receiver, 300)
            assert data == b"".join(b"%03d" % i for i in range(100))
            nursery.cancel_scope.cancel()


async def test_the_budget_holds_producers_while_the_peer_does_not_read() -> None:
    limit = 64 * 1024
    async with tcp_pair(rcvbuf=16 * 1024, sndbuf=16 * 1024) as (sender, receiver):
        writer = FrameWriter(sender, limit)
        payload = os.urandom(8 * 1024)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            put = 0
            # nowait never blocks, even past the budget ...
            while not writer.full:
                writer.put_nowait(payload)
                put += len(payload)
                await trio.testing.wait_all_tasks_blocked()
            writer.put_nowait(payload)
            put += len(payload)
            assert writer.queued_bytes >= limit
            # ... but wait_writable holds whoever produces more until the peer reads.
            with trio.move_on_after(0.2) as waited:
                await writer.wait_writable()
            assert waited.cancelled_caught
            received = bytearray()

            async def read_all() -> None:
                received.extend(await receive_exactly(receiver, put))

            nursery.start_soon(read_all)
            with trio.fail_after(10):
                await writer.wait_writable()
                await writer.wait_empty()
            assert not writer.full
            await trio.testing.wait_all_tasks_blocked()
            assert bytes(received) == payload * (put // len(payload))
            nursery.cancel_scope.cancel()


async def test_frames_of_an_owner_are_dropped_while_queued_and_once_detached() -> None:
    async with tcp_pair() as (sender, receiver):
        writer = FrameWriter(sender)
        sub, other = Sub(), Sub()
        writer.put_nowait(b"a", sub)
        writer.put_nowait(b"b", other)
        writer.put_nowait(b"c", sub)
        assert writer.drop(sub) == 2
        sub.detached = True
        writer.put_nowait(b"d", sub)
        writer.put_nowait(b"e")
        assert writer.queued_bytes == 2
        assert await written(writer, receiver, 2) == b"be"


async def test_file_chunks_go_by_sendfile_after_their_head(tmp_path) -> None:
    path = tmp_path / "segment"
    body = os.urandom(300_000)
    path.write_bytes(body)
    chunks = [FileRange(str(path), 0, 100_000), FileRange(str(path), 100_000, 200_000)]
    async with tcp_pair() as (sender, receiver):
        writer = FrameWriter(sender)
        writer.put_nowait(b"before;")
        writer.put_chunks_nowait(b"head;", chunks)
        writer.put_nowait(b";after")
        total = 7 + 5 + 300_000 + 6
        assert writer.queued_bytes == total
        assert await written(writer, receiver, total) == b"before;head;" + body + b";after"
    assert all(c.closed for c in chunks)


async def test_a_file_shorter_than_its_chunk_raises_short_chunk(tmp_path) -> None:
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 10)
    chunk = FileRange(str(path), 0, 20)
    async with tcp_pair() as (sender, _receiver):
        writer = FrameWriter(sender)
        writer.put_chunks_nowait(b"h", [chunk])
        with pytest.raises(ShortChunk):
            await writer.run()
    assert chunk.closed


async def test_close_drops_what_is_queued_and_closes_its_chunks(tmp_path) -> None:
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 10)
    chunk = FileRange(str(path), 0, 10)
    async with tcp_pair() as (sender, _receiver):
        writer = FrameWriter(sender, 100)
        writer.put_nowait(b"frame")
        writer.put_chunks_nowait(b"h", [chunk])
        writer.close()
        assert chunk.closed and writer.queued_bytes == 0
        late = FileRange(str(path), 0, 10)
        writer.put_chunks_nowait(b"h", [late])
        writer.put_nowait(b"late")
        assert late.closed and writer.queued_bytes == 0
        await writer.wait_writable()  # closed: never waits
        await writer.wait_empty()


async def test_a_reset_peer_breaks_the_writer() -> None:
    async with tcp_pair() as (sender, receiver):
        writer = FrameWriter(sender)
        reset(receiver)
        await trio.sleep(0.05)
        writer.put_nowait(b"x" * 1024 * 1024)
        with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
            await writer.run()


async def test_more_than_one_write_of_frames_goes_out_in_order() -> None:
    frames = [os.urandom(10_000) for _ in range(300)]  # 3 MB: several writes
    async with tcp_pair() as (sender, receiver):
        for plain in (True, False):
            writer = FrameWriter(sender, direct=False)
            owner = Sub()
            for i, frame in enumerate(frames):
                writer.put_nowait(frame, None if plain or i % 7 else owner)
            writer.put_urgent(b"urgent")
            data = await written(writer, receiver, 6 + 3_000_000)
            assert data == b"urgent" + b"".join(frames)
            assert writer.bytes_sent == 3_000_006


class Held:
    """A chunk held in memory (the tail cache's), as the store hands one out."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.closed = False

    @property
    def length(self) -> int:
        return len(self.data)

    def read_bytes(self) -> bytes:
        return self.data

    def sendfile_source(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


async def test_buffers_go_out_as_they_are_in_order_with_the_frames_around_them() -> None:
    # Large buffers (records) between small frames, to a peer that reads slowly: vectored
    # writes that stop inside a buffer and resume there.
    pieces = [bytearray(b"HEAD"), os.urandom(700_000), b"MID", bytearray(os.urandom(300_000)),
              b"TAIL"]
    whole = b"".join(pieces)
    async with tcp_pair(rcvbuf=16 * 1024, sndbuf=16 * 1024) as (sender, receiver):
        for direct in (True, False):
            writer = FrameWriter(sender, direct=direct)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await trio.testing.wait_all_tasks_blocked()
                writer.put_nowait(b"before;")
                writer.put_parts_nowait(pieces)
                writer.put_nowait(b";after")
                assert 0 < writer.queued_bytes <= len(whole) + 13
                data = await receive_exactly(receiver, len(whole) + 13)
                await writer.wait_empty()
                nursery.cancel_scope.cancel()
            assert data == b"before;" + whole + b";after"
            assert writer.queued_bytes == 0


async def test_an_idle_writer_writes_buffers_at_once_and_small_ones_are_joined() -> None:
    async with tcp_pair(rcvbuf=1 << 20, sndbuf=1 << 20) as (sender, receiver):
        writer = FrameWriter(sender)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.testing.wait_all_tasks_blocked()
            writer.put_parts_nowait([b"size", b"x" * 100])  # small: one joined put
            big = [b"size", os.urandom(100_000)]
            writer.put_parts_nowait(big)  # the socket takes it whole, by the put itself
            assert writer.bytes_sent == 100_108 and writer.queued_bytes == 0
            data = await receive_exactly(receiver, 100_108)
            assert data == b"size" + b"x" * 100 + b"".join(big)
            nursery.cancel_scope.cancel()


async def test_buffers_on_a_stream_that_is_not_a_socket_are_joined() -> None:
    sender, receiver = trio.testing.memory_stream_pair()
    writer = FrameWriter(sender)
    pieces = [b"head", os.urandom(200_000)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        writer.put_parts_nowait(pieces)
        data = bytearray()
        while len(data) < 200_004:
            data += await receiver.receive_some()
        nursery.cancel_scope.cancel()
    assert data == b"".join(pieces)


async def test_chunks_held_in_memory_go_out_with_their_head_without_a_join() -> None:
    chunks = [Held(os.urandom(90_000)), Held(os.urandom(50_000))]
    async with tcp_pair(rcvbuf=16 * 1024, sndbuf=16 * 1024) as (sender, receiver):
        writer = FrameWriter(sender)
        writer.put_chunks_nowait(b"head", chunks)
        assert all(c.closed for c in chunks)
        data = await written(writer, receiver, 140_004)
        assert data == b"head" + chunks[0].data + chunks[1].data


async def test_a_reset_peer_breaks_a_vectored_write() -> None:
    async with tcp_pair() as (sender, receiver):
        writer = FrameWriter(sender)
        reset(receiver)
        await trio.sleep(0.05)
        writer.put_parts_nowait([b"head", b"x" * 1024 * 1024])
        with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
            await writer.run()


class OnDemand:
    """Starts a writer's task on demand in ``nursery`` and counts the starts and ends."""

    def __init__(self, writer: FrameWriter, nursery: trio.Nursery) -> None:
        self.writer = writer
        self.nursery = nursery
        self.started = self.ended = 0
        writer.on_demand(self.spawn)

    def spawn(self) -> None:
        self.started += 1
        self.nursery.start_soon(self.run)

    async def run(self) -> None:
        await self.writer.run()
        self.ended += 1


async def test_on_demand_a_writer_task_runs_only_while_the_socket_is_behind() -> None:
    async with tcp_pair(rcvbuf=16 * 1024, sndbuf=16 * 1024) as (sender, receiver):
        writer = FrameWriter(sender, 1024 * 1024)
        async with trio.open_nursery() as nursery:
            tasks = OnDemand(writer, nursery)
            writer.put_nowait(b"reply")  # the socket takes it: no task
            await trio.testing.wait_all_tasks_blocked()
            assert tasks.started == 0 and writer.bytes_sent == 5
            assert await receive_exactly(receiver, 5) == b"reply"
            payload = os.urandom(256 * 1024)  # more than the socket takes at once
            writer.put_nowait(payload)
            writer.put_nowait(b"after")
            assert tasks.started == 1 and writer.queued_bytes > 0
            received = await receive_exactly(receiver, len(payload) + 5)
            assert received == payload + b"after"
            await writer.wait_empty()
            await trio.testing.wait_all_tasks_blocked()
            assert tasks.ended == 0  # parked, not gone, until retired
            writer.retire()
            await trio.testing.wait_all_tasks_blocked()
            assert tasks.ended == 1
            writer.retire()  # nothing to retire: no effect
            writer.put_nowait(payload)  # started again when needed
            assert tasks.started == 2
            assert await receive_exactly(receiver, len(payload)) == payload
            await writer.wait_empty()
            writer.close()
            nursery.cancel_scope.cancel()


async def test_a_put_between_retire_and_the_task_ending_is_still_sent() -> None:
    async with tcp_pair(rcvbuf=16 * 1024, sndbuf=16 * 1024) as (sender, receiver):
        writer = FrameWriter(sender)
        async with trio.open_nursery() as nursery:
            tasks = OnDemand(writer, nursery)
            payload = os.urandom(256 * 1024)
            writer.put_nowait(payload)
            assert await receive_exactly(receiver, len(payload)) == payload
            await writer.wait_empty()
            await trio.testing.wait_all_tasks_blocked()
            writer.retire()  # the task is woken to end, but has not run yet
            writer.put_nowait(payload)
            assert await receive_exactly(receiver, len(payload)) == payload
            await writer.wait_empty()
            await trio.testing.wait_all_tasks_blocked()
            assert tasks.started == 1 and tasks.ended == 1  # it sent, then ended
            writer.close()
            nursery.cancel_scope.cancel()
