"""Abusers that speak Figg: ATTACH to many new topics (issue 15, item 7) and frames with
header version 2 (item 8)."""

from __future__ import annotations

import time
from typing import Final

import trio

from gateway.bench.soak.plan import Context, Tally
from gateway.bench.soak.wire import close
from protocols.connection import CLOSED, Role
from protocols.errors import ProtocolError
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import FAST, HEADER, MessageType, Pong
from protocols.figg.records import Attached

#: ATTACHes sent before the abuser waits for their answers.
ATTACH_BATCH: Final = 50
ANSWER_TIMEOUT: Final = 10.0

_encode_attach = FAST[MessageType.ATTACH].encode_frame
_encode_ping = FAST[MessageType.PING].encode_frame


async def attach_flood(ctx: Context, tally: Tally) -> None:
    """Item 7: one connection ATTACHes to ``attach_topics`` new topics, in batches;
    a connection the server closes is replaced. Counts the ATTACHED answers."""
    index = 0
    while index < ctx.caps.attach_topics:
        stream = await ctx.open(ctx.target.figg, tally)
        if stream is None:
            await trio.sleep(0.5)
            continue
        try:
            index = await _attach_on(ctx, tally, stream, index)
        finally:
            await close(stream)


async def _attach_on(ctx: Context, tally: Tally, stream: trio.SocketStream, index: int
                     ) -> int:
    """ATTACH batches on ``stream`` from topic ``index``; the next index to attach when
    the server closes the connection (or all are done)."""
    conn = FiggConnection(Role.CLIENT)
    while index < ctx.caps.attach_topics:
        batch = range(index, min(index + ATTACH_BATCH, ctx.caps.attach_topics))
        frames = b"".join(_encode_attach(0, f"soak-attach-{ctx.run}-{i}".encode(), 0)
                          for i in batch)
        index = batch.stop
        if not await ctx.send(stream, frames, tally):
            return index
        answered = [0]
        try:
            with trio.move_on_after(ANSWER_TIMEOUT) as scope:
                await _count_attached(stream, conn, answered, len(batch))
        finally:  # the answers so far count when the soak ends in the middle of a batch
            tally.count("attached", answered[0])
        if scope.cancelled_caught:
            tally.count("batches_unanswered")
        elif answered[0] < len(batch):
            tally.closed_by_server += 1
            return index
    # Keep the subscriptions while the soak runs: what they cost the server is the point.
    await trio.sleep_forever()
    return index


async def _count_attached(stream: trio.SocketStream, conn: FiggConnection,
                          got: list[int], wanted: int) -> None:
    """Read until ``got[0]`` reaches ``wanted`` ATTACHED (or the server closed)."""
    while got[0] < wanted:
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        conn.receive_data(data)
        try:
            events = conn.next_events()
        except ProtocolError:
            return
        for event in events:
            if event is CLOSED:
                return
            if type(event) is Attached:
                got[0] += 1


async def figg_version(ctx: Context, tally: Tally) -> None:
    """Item 8: PINGs whose header says version 2, each on a new connection; counts the
    ones answered with a PONG (the real Figg server ignores the version) and the ones
    the server closed."""
    for _ in range(ctx.caps.odd_rounds):
        stream = await ctx.open(ctx.target.figg, tally)
        if stream is not None:
            try:
                tally.count(await _version_two_ping(ctx, tally, stream))
            finally:
                await close(stream)
        await trio.sleep(1.0)


async def _version_two_ping(ctx: Context, tally: Tally, stream: trio.SocketStream) -> str:
    """``"answered"``, ``"closed"`` or ``"silent"``."""
    ping = bytearray(_encode_ping(time.time_ns()))
    HEADER.pack_into(ping, 0, MessageType.PING, 2, len(ping) - HEADER.size)
    if not await ctx.send(stream, bytes(ping), tally):
        return "closed"
    conn = FiggConnection(Role.CLIENT)
    with trio.move_on_after(ANSWER_TIMEOUT):
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            conn.receive_data(data)
            try:
                events = conn.next_events()
            except ProtocolError:
                return "bad answer"
            if any(type(e) is Pong for e in events):
                return "answered"
            if not data or any(e is CLOSED for e in events):
                tally.closed_by_server += 1
                return "closed"
    return "silent"
