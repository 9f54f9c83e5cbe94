"""The one tail reader of a partition (:mod:`gateway.tail.reader`), over real sockets:
Figg, SSE and WebSocket subscribers of a partition follow one reader (the gauge
``figtank_tail_readers``, the reader's sinks and its count of backend reads say so), it
stops a short while after the last of them left, and an outage of a bridge's upstream
reaches both families through it; and where a chunk's reader leaves it
(:func:`~protocols.tank.bundle.chunk_end`) is where decoding it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from gateway.figg.feed import feed_key
from gateway.http.tail import PartitionTail
from gateway.server.run import ServerInfo
from gateway.tail import reader as reader_module
from gateway.tail.reader import TailReader, TailReaders
from protocols.figg.messages import Attached
from protocols.tank.bundle import (
    Codec,
    Message,
    chunk_end,
    decode_chunk,
    encode_bundle,
    frame_bundle,
)
from tests.bridge.helpers import metric
from tests.figg.helpers import RawPeer, attach, publish
from tests.http.helpers import SseReader, with_figg
from tests.http.outage_helpers import bridge_over_a_restartable_broker, produce
from tests.http.ws_client import WsClient

READERS = "figtank_tail_readers"


def _readers(info: ServerInfo) -> TailReaders:
    readers: TailReaders = info.listeners["figg"].readers  # type: ignore[attr-defined]
    assert info.listeners["http"].tails._readers is readers  # type: ignore[attr-defined]
    return readers


async def _figg(info: ServerInfo) -> RawPeer:
    assert info.figg is not None
    return RawPeer(await trio.open_tcp_stream(*info.figg))


async def _followed_by(readers: TailReaders, topic: str, users: int) -> TailReader:
    """The reader of ``topic``/0 once ``users`` subscribers hold it."""
    with trio.fail_after(10):
        while True:
            reader = readers.get(topic, 0)
            if reader is not None and reader.users == users:
                return reader
            await trio.sleep(0.01)


async def test_figg_sse_and_websocket_subscribers_of_a_partition_share_one_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module, "LINGER_SECS", 0.3)
    with trio.fail_after(30):
        async with with_figg(tmp_path, http_heartbeat_secs=0.2) as info:
            readers = _readers(info)
            assert info.http is not None
            pub = await _figg(info)
            await pub.send(publish("shared", 1, b"first"))
            await pub.receive(1)
            assert metric(info, READERS) == 0
            # Two Figg topic names of the partition, an SSE stream, a WebSocket.
            figg = [await _figg(info), await _figg(info)]
            for peer, name in zip(figg, ("shared", "shared/0"), strict=True):
                await peer.send(attach(name, 1))
                assert await peer.receive_one() == Attached(name, 1)
            sse = await SseReader.open(*info.http, "/topics/shared/events?from=earliest")
            assert (await sse.next())["id"] == "1"
            ws = await WsClient.connect(*info.http)
            assert (await ws.next())["op"] == "hello"
            await ws.send({"op": "attach", "topic": "shared", "from": "earliest"})
            await ws.until("attached")
            assert (await ws.next())["offset"] == 1
            reader = await _followed_by(readers, "shared", 4)
            assert metric(info, READERS) == 1
            # Its sinks: each Figg topic name's feed (its DATA frames), one HTTP tail.
            feeds = [reader.find(feed_key(b"shared")), reader.find(feed_key(b"shared/0"))]
            assert all(feed is not None for feed in feeds)
            http = info.listeners["http"].tails.get("shared", 0)  # type: ignore[attr-defined]
            assert isinstance(http, PartitionTail) and http.reader is reader
            reads = reader.reads

            count = 40
            for start in range(2, count + 2, 10):
                await pub.send(*(publish("shared", seq, b"m%d" % seq)
                                 for seq in range(start, start + 10)))
                await pub.receive(10)
            expected = [(seq, b"m%d" % seq) for seq in range(2, count + 2)]
            for peer in figg:
                assert [(d.offset, d.data) for d in await peer.receive(count)] == expected
            events = [await sse.next() for _ in range(count)]
            assert [(int(e["id"]), json.loads(e["data"])["value"].encode())
                    for e in events] == expected
            got = [await ws.next() for _ in range(count)]
            assert [(m["offset"], m["value"].encode()) for m in got] == expected
            # One reader read it all for the four: at most a read a publish (and its
            # long poll waiting at the end), not one a subscriber.
            assert readers.get("shared", 0) is reader and len(readers) == 1
            assert 0 < reader.reads - reads <= count + 1
            assert metric(info, READERS) == 1

            # The last subscriber leaves (the SSE stream seen gone at a heartbeat): the
            # reader stops a short while after.
            for peer in figg:
                await peer.aclose()
            await sse.client.aclose()
            await ws.aclose()
            await _followed_by(readers, "shared", 0)
            # Its sinks are told and gone when its task ends, a step after the reaper
            # takes it out of the table and cancels it (a loaded machine sees between).
            with trio.fail_after(5):
                while (readers.get("shared", 0) is not None
                       or reader.find(feed_key(b"shared")) is not None):
                    await trio.sleep(0.05)
            assert metric(info, READERS) == 0
            assert reader.find(feed_key(b"shared")) is None  # its sinks told and gone
            # The next subscriber at the tail starts a new one, where the log ends.
            again = await _figg(info)
            await again.send(attach("shared", count + 1))
            assert await again.receive_one() == Attached("shared", count + 1)
            fresh = await _followed_by(readers, "shared", 1)
            assert fresh is not reader and fresh.next_seq == count + 2
            await pub.send(publish("shared", count + 2, b"last"))
            await pub.receive(1)
            assert [(d.offset, d.data) for d in await again.receive(1)] == [
                (count + 2, b"last")]


async def test_an_upstream_outage_reaches_the_figg_and_http_followers_of_the_reader(
        tmp_path: Path) -> None:
    """A bridge's broker stops while a Figg subscriber and an SSE stream follow one
    reader: the reader is unavailable, the Figg feed releases its follower, the stream is
    told; once the broker is back both get what is published next, once, in order, and
    follow the reader again."""
    with trio.fail_after(60):
        async with bridge_over_a_restartable_broker(tmp_path / "broker") as (bridge, broker):
            assert bridge.http is not None
            readers = _readers(bridge)
            base = f"http://{bridge.http[0]}:{bridge.http[1]}"
            assert await produce(base, "m1") == 1
            sub = await _figg(bridge)
            await sub.send(attach("out", 1))
            assert await sub.receive_one() == Attached("out", 1)
            sse = await SseReader.open(*bridge.http, "/topics/out/events?from=earliest")
            assert (await sse.next())["id"] == "1"
            reader = await _followed_by(readers, "out", 2)
            feed = reader.find(feed_key(b"out"))
            assert feed is not None and feed.followers == 1  # type: ignore[attr-defined]

            await broker.stop()
            event = await sse.next()
            assert event.get("event") == "unavailable", event
            assert reader.unavailable is not None
            assert feed.followers == 0  # type: ignore[attr-defined]  # reads on its own

            await broker.start()
            event = await sse.next(timeout=30)
            assert event.get("event") == "available", event
            for i in (2, 3, 4):
                assert await produce(base, f"m{i}") == i
            assert [(d.offset, d.data) for d in await sub.receive(3)] == [
                (2, b"m2"), (3, b"m3"), (4, b"m4")]
            events = [await sse.next() for _ in range(3)]
            assert [(e["id"], json.loads(e["data"])["value"]) for e in events] == [
                ("2", "m2"), ("3", "m3"), ("4", "m4")]
            assert readers.get("out", 0) is reader and reader.unavailable is None
            with trio.fail_after(10):  # the Figg subscriber at the tail follows again
                while feed.followers != 1:  # type: ignore[attr-defined]
                    await trio.sleep(0.05)
            await sub.aclose()
            await sse.client.aclose()


def _messages(first: int, count: int) -> list[Message]:
    return [Message(b"v%d" % seq, seq=seq) for seq in range(first, first + count)]


@pytest.mark.parametrize("min_seq", [1, 3, 5, 9, 12, 200, 330, 400])
def test_where_a_chunk_leaves_its_reader_is_where_decoding_it_does(min_seq: int) -> None:
    plain = frame_bundle(encode_bundle(_messages(1, 4)))  # 1..4, numbered from base
    sparse = frame_bundle(encode_bundle([Message(b"a", seq=7), Message(b"b", seq=9)],
                                        sparse=True))
    more = frame_bundle(encode_bundle(_messages(10, 2)))  # 10, 11 after the sparse one
    big = frame_bundle(encode_bundle(_messages(12, 300)))  # its count a varint
    packed = frame_bundle(encode_bundle(_messages(312, 50), codec=Codec.SNAPPY))
    chunk = plain + sparse + more + big + packed
    for data in (chunk, chunk[:-3], chunk[:-len(packed) - 1], plain + sparse[:2],
                 plain[:1]):
        found = decode_chunk(data, 1, min_seq)
        assert chunk_end(data, 1, min_seq) == (found.next_seq, found.partial_bundle_len)


async def test_the_http_tail_of_a_reader_that_figg_keeps_stops_after_its_last_stream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The HTTP subscribers leave while a Figg one stays: the reader goes on for it, and
    its HTTP tail stops decoding a short while after; a new stream gets a new one."""
    monkeypatch.setattr(reader_module, "LINGER_SECS", 0.3)
    with trio.fail_after(30):
        async with with_figg(tmp_path, http_heartbeat_secs=0.2) as info:
            readers = _readers(info)
            tails = info.listeners["http"].tails  # type: ignore[attr-defined]
            assert info.http is not None
            pub = await _figg(info)
            await pub.send(publish("kept", 1, b"first"))
            await pub.receive(1)
            sub = await _figg(info)
            await sub.send(attach("kept", 1))
            assert await sub.receive_one() == Attached("kept", 1)
            sse = await SseReader.open(*info.http, "/topics/kept/events?from=earliest")
            assert (await sse.next())["id"] == "1"
            reader = await _followed_by(readers, "kept", 2)
            http = tails.get("kept", 0)
            assert http is not None
            await sse.client.aclose()
            await _followed_by(readers, "kept", 1)
            await trio.sleep(0.4)
            seq = 2
            await pub.send(publish("kept", seq, b"m2"))
            await pub.receive(1)
            assert [d.offset for d in await sub.receive(1)] == [seq]
            assert tails.get("kept", 0) is None and readers.get("kept", 0) is reader
            assert http.failed is not None and http.next_seq == seq  # decoded no more
            sse = await SseReader.open(*info.http, "/topics/kept/events?from=2")
            await pub.send(publish("kept", 3, b"m3"))
            await pub.receive(1)
            assert [d.offset for d in await sub.receive(1)] == [3]
            events = [await sse.next() for _ in range(2)]  # 2 from the log, 3 at the tail
            assert [(e["id"], json.loads(e["data"])["value"]) for e in events] == [
                ("2", "m2"), ("3", "m3")]
            fresh = tails.get("kept", 0)
            assert fresh is not None and fresh is not http and fresh.reader is reader
            await sse.client.aclose()
            await sub.aclose()
