"""Abusers that make the server hold memory: connections that declare a huge frame, send
tens of MB and close (issue 15, item 2), and Figg connections that send part of a frame
and stall (item 3). Every byte they send comes from one shared buffer."""

from __future__ import annotations

import time
from typing import Final

import trio

from gateway.bench.soak.plan import Context, MiB, Tally
from gateway.bench.soak.wire import close
from protocols.figg.messages import HEADER as FIGG_HEADER
from protocols.figg.messages import VERSION, MessageType
from protocols.tank.connection import FRAME_HEADER as TANK_HEADER
from protocols.tank.messages import MsgId

#: What the abusers send after a frame header: zeros, in 1 MiB writes.
_ZEROS: Final = memoryview(bytes(MiB))
#: The frame size a stalled Figg connection declares.
STALL_FRAME: Final = 48 * MiB


def tank_header(length: int) -> bytes:
    """A Tank Produce frame header announcing ``length`` payload bytes."""
    return TANK_HEADER.pack(MsgId.PRODUCE, length)


def figg_header(length: int, version: int = VERSION) -> bytes:
    """A Figg PUBLISH frame header announcing ``length`` payload bytes."""
    return FIGG_HEADER.pack(MessageType.PUBLISH, version, length)


async def send_zeros(ctx: Context, stream: trio.SocketStream, count: int, tally: Tally
                     ) -> bool:
    """Send ``count`` zero bytes; False when the server closed the connection."""
    while count > 0:
        piece = _ZEROS[:min(count, len(_ZEROS))]
        if not await ctx.send(stream, piece, tally):
            return False
        count -= len(piece)
    return True


async def big_frames(ctx: Context, tally: Tally) -> None:
    """Item 2: rounds of connections (Tank and Figg in turn) that each declare a frame of
    ``big_frame_mib`` (less 1 KiB), send ``big_frame_send_mib`` of it and close."""
    caps = ctx.caps
    declared = caps.big_frame_mib * MiB - 1024
    for round_index in range(caps.big_frame_rounds):
        async with trio.open_nursery() as nursery:
            for index in range(caps.big_frame_connections):
                figg = (round_index + index) % 2 == 1
                nursery.start_soon(_one_big_frame, ctx, tally, figg, declared)
        tally.count("rounds")
        await trio.sleep(caps.big_frame_interval)


async def _one_big_frame(ctx: Context, tally: Tally, figg: bool, declared: int) -> None:
    address = ctx.target.figg if figg else ctx.target.tank
    stream = await ctx.open(address, tally)
    if stream is None:
        return
    try:
        header = figg_header(declared) if figg else tank_header(declared)
        if await ctx.send(stream, header, tally):
            await send_zeros(ctx, stream, ctx.caps.big_frame_send_mib * MiB, tally)
    finally:
        await close(stream)


async def partial_frames(ctx: Context, tally: Tally) -> None:
    """Item 3: ``stall_connections`` Figg connections at a time that each send the
    header of a 48 MiB PUBLISH and ``stall_send_mib`` of it, then nothing; a connection
    the server closes is counted (with how long it was left open) and replaced, up to
    ``stall_total`` connections."""
    caps = ctx.caps
    close_after: list[float] = []
    opened = 0

    async def staller() -> None:
        nonlocal opened
        while opened < caps.stall_total:
            opened += 1
            stream = await ctx.open(ctx.target.figg, tally)
            if stream is None:
                await trio.sleep(0.5)
                continue
            try:
                start = time.monotonic()
                if not (await ctx.send(stream, figg_header(STALL_FRAME), tally)
                        and await send_zeros(ctx, stream, caps.stall_send_mib * MiB, tally)):
                    continue
                await _wait_closed(stream)
                tally.closed_by_server += 1
                close_after.append(time.monotonic() - start)
                tally.notes["closed_after_seconds"] = {
                    "min": round(min(close_after), 2), "max": round(max(close_after), 2)}
            finally:
                await close(stream)

    async with trio.open_nursery() as nursery:
        for _ in range(caps.stall_connections):
            nursery.start_soon(staller)


async def _wait_closed(stream: trio.SocketStream) -> None:
    """Wait until the server closes ``stream``, reading whatever it sends; runs until
    cancelled while it keeps the connection open."""
    try:
        while await stream.receive_some(65536):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
