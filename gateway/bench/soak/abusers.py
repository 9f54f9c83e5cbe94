"""Every abuser of the soak by name, with the issue 15 item it reproduces."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from gateway.bench.soak.figg_abusers import attach_flood, figg_version
from gateway.bench.soak.http_abusers import (
    http_oddities,
    scrape_back_to_back,
    scrape_never_read,
    scrape_slow,
)
from gateway.bench.soak.memory_abusers import big_frames, partial_frames
from gateway.bench.soak.plan import Context, Tally
from gateway.bench.soak.tank_abusers import consume_flood, sparse_sequence, topic_flood

Abuser = Callable[[Context, Tally], Awaitable[None]]

#: name -> (abuser, what it does).
ABUSERS: Final[dict[str, tuple[Abuser, str]]] = {
    "consume-flood": (consume_flood, "1: Tank connections pipelining 1 MiB Consumes, unread"),
    "topic-flood": (topic_flood, "1, 7: auto-created topics, a very wide CreateTopic, "
                                 "64-byte segments"),
    "big-frames": (big_frames, "2: declare a 64 MiB frame, send tens of MB, close"),
    "partial-frames": (partial_frames, "3: Figg connections that send part of a frame"),
    "scrape-back-to-back": (scrape_back_to_back, "4: /metrics as fast as it answers"),
    "scrape-slow": (scrape_slow, "4: /metrics asked and read a byte or 1 KiB at a time"),
    "scrape-never-read": (scrape_never_read, "4: /metrics asked and never read"),
    "sparse-sequence": (sparse_sequence, "5: a sparse bundle at 2^64 - 3, then produces"),
    "attach-flood": (attach_flood, "7: Figg ATTACH to many new topics"),
    "figg-version": (figg_version, "8: Figg PING with header version 2"),
    "http-oddities": (http_oddities, "8: bare-LF requests and /metrics?x=1"),
}


async def run_abuser(name: str, ctx: Context, tally: Tally) -> None:
    """Run abuser ``name`` until it is done or cancelled; an exception it raises is kept
    in ``tally.error`` instead of ending the soak."""
    abuser, _ = ABUSERS[name]
    start = time.monotonic()
    try:
        await abuser(ctx, tally)
        tally.notes["done_after_seconds"] = round(time.monotonic() - start, 1)
    except Exception as exc:  # one abuser's bug or surprise must not end the others
        tally.error = f"{type(exc).__name__}: {exc}"
    except BaseExceptionGroup as group:  # cancelled while some task had failed
        _, failed = group.split(trio.Cancelled)
        if failed is None:
            raise
        tally.error = repr(_first(failed))


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
