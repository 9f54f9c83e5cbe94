"""Abusers of the metrics and health listener (issue 15, items 4 and 8): back-to-back
scrapes, slow scrapers, scrapers that never read, requests ending in a bare LF and a
query string on ``/metrics``."""

from __future__ import annotations

from typing import Final

import trio

from gateway.bench.soak.plan import Context, Tally, hold_unread
from gateway.bench.soak.wire import HttpAnswer, close, http_get, http_request
from gateway.bench.stats import summarize

#: How often a slow scraper sends one byte of its request or reads 1 KiB of the answer.
SLOW_STEP: Final = 0.5


def _count_answer(tally: Tally, answer: HttpAnswer, prefix: str) -> None:
    tally.connections += 1
    if answer.status == 200:
        tally.count(f"{prefix}_200")
    else:
        tally.count(f"{prefix}_failed")
        tally.notes.setdefault(f"{prefix}_first_failure",
                               answer.error or f"status {answer.status}")


async def scrape_back_to_back(ctx: Context, tally: Tally) -> None:
    """Item 4: ``scrapers`` loops each fetching ``/metrics`` as fast as it is answered."""
    seconds: list[float] = []

    async def scraper() -> None:
        while True:
            answer = await http_get(ctx.target.metrics, "/metrics", timeout=30.0)
            _count_answer(tally, answer, "scrapes")
            seconds.append(answer.seconds)
            tally.notes["last_body_bytes"] = answer.body_bytes
            if answer.status != 200:
                await trio.sleep(0.1)

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(ctx.caps.scrapers):
                nursery.start_soon(scraper)
    finally:
        stats = summarize(seconds) or {}
        tally.notes["scrape_ms"] = {k: round(stats[k] * 1000, 1)
                                    for k in ("p50", "p99", "max") if k in stats}


async def scrape_slow(ctx: Context, tally: Tally) -> None:
    """Item 4: slow scrapers, half sending their request a byte every half second, half
    reading the answer 1 KiB every half second; each starts over when the server closes
    its connection (counted) or it is done."""
    async with trio.open_nursery() as nursery:
        for index in range(ctx.caps.slow_scrapers):
            nursery.start_soon(_slow_scraper, ctx, tally, index % 2 == 0)


async def _slow_scraper(ctx: Context, tally: Tally, slow_writer: bool) -> None:
    request = http_request("/metrics").replace(b"Connection: close", b"Connection: keep-alive")
    while True:
        stream = await ctx.open(ctx.target.metrics, tally)
        if stream is None:
            await trio.sleep(1.0)
            continue
        try:
            if slow_writer:
                done = await _send_slowly(ctx, tally, stream, request)
            else:
                done = await ctx.send(stream, request, tally) and await _read_slowly(
                    tally, stream)
            if done:
                tally.count("finished")
        finally:
            await close(stream)


async def _send_slowly(ctx: Context, tally: Tally, stream: trio.SocketStream,
                       request: bytes) -> bool:
    for i in range(len(request)):
        if not await ctx.send(stream, request[i:i + 1], tally):
            return False
        await trio.sleep(SLOW_STEP)
    return await _read_slowly(tally, stream)


async def _read_slowly(tally: Tally, stream: trio.SocketStream) -> bool:
    """Read 1 KiB every :data:`SLOW_STEP` until the server closes (counted: False)."""
    while True:
        try:
            data = await stream.receive_some(1024)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            tally.closed_by_server += 1
            return False
        tally.count("bytes_read", len(data))
        await trio.sleep(SLOW_STEP)


async def scrape_never_read(ctx: Context, tally: Tally) -> None:
    """Item 4: ``silent_scrapers`` connections that ask for ``/metrics`` and never read;
    one the server closes is counted and replaced (at most 10 times over)."""
    request = http_request("/metrics").replace(b"Connection: close", b"Connection: keep-alive")
    budget = ctx.caps.silent_scrapers * 10

    async def silent() -> None:
        nonlocal budget
        while budget > 0:
            budget -= 1
            stream = await ctx.open(ctx.target.metrics, tally)
            if stream is None:
                await trio.sleep(1.0)
                continue
            if not await ctx.send(stream, request, tally):
                await close(stream)
                continue
            await hold_unread(stream, tally, float("inf"))

    async with trio.open_nursery() as nursery:
        for _ in range(ctx.caps.silent_scrapers):
            nursery.start_soon(silent)


async def http_oddities(ctx: Context, tally: Tally) -> None:
    """Item 8: ``/health`` asked with bare-LF line ends and ``/metrics?x=1``, in turn;
    records their status codes and how long the bare-LF answers took."""
    bare_lf: list[float] = []
    for _ in range(ctx.caps.odd_rounds):
        answer = await http_get(ctx.target.metrics, "/health", line_end=b"\n", timeout=15.0)
        _count_answer(tally, answer, "bare_lf_health")
        bare_lf.append(answer.seconds)
        tally.notes["bare_lf_seconds_max"] = round(max(bare_lf), 3)
        answer = await http_get(ctx.target.metrics, "/metrics?x=1", timeout=15.0)
        _count_answer(tally, answer, "metrics_query")
        await trio.sleep(1.0)
