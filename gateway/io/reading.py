"""Reading a plain socket without trio's stream layers."""

from __future__ import annotations

import os

import trio

__all__ = ["receive"]


async def receive(fd: int, size: int, eager: bool = False) -> bytes:
    """Up to ``size`` bytes from the plain socket ``fd`` (``b""``: EOF), as
    ``trio.SocketStream.receive_some`` does it (a checkpoint either way) with two
    coroutines fewer: an idle connection's reader keeps this frame while it waits, not
    the stream's, the socket wrapper's and their helpers' (~1 KB).

    ``eager``: bytes that are there at once come back without the scheduler round
    (cancellation is still checked); the caller makes sure that the next read is not
    eager, so a peer that always has bytes ready still lets the other tasks run every
    second read."""
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        data = os.read(fd, size)
    except BlockingIOError:
        pass
    else:
        if not eager:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return os.read(fd, size)
        except BlockingIOError:
            pass
