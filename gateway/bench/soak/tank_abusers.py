"""Abusers that speak Tank: pipelined Consumes nobody reads (issue 15, item 1), topic
creation without end (1 and 7) and a sparse bundle at the end of the sequence space (5)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from gateway.bench.soak.plan import Context, MiB, Tally, hold_unread
from gateway.bench.soak.wire import close
from gateway.client.errors import ClientError, ConnectError, ProduceFailed
from gateway.client.figg import open_figg_client
from gateway.client.lone import running
from gateway.client.tank import TankClient, open_tank_client
from protocols.tank.bundle import Codec, Message, encode_bundle
from protocols.tank.connection import frame
from protocols.tank.messages import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    encode_payload,
)
from protocols.wire import UINT64_MAX

#: Seconds a Tank request may take before the abuser gives up on its connection.
REQUEST_TIMEOUT: Final = 30.0


@asynccontextmanager
async def tank(ctx: Context, tally: Tally) -> AsyncIterator[TankClient]:
    """A Tank client counted in ``tally`` (ClientError when the server does not take it)."""
    client = TankClient(*ctx.target.tank, client_id="soak-abuser", connect_timeout=10.0)
    try:
        await client.connect()
    except ConnectError:
        tally.refused += 1
        raise
    tally.connections += 1
    async with running(client.serve, client.aclose):
        yield client


#: Messages of 64 KiB in each 1 MiB bundle of the data topic.
DATA_BUNDLE: Final = 16


async def fill_topic(ctx: Context) -> None:
    """Put ``caps.data_mib`` of 64 KiB messages into ``ctx.data_topic`` (1 MiB a
    bundle); sets ``ctx.data_last``."""
    values = [bytes([i % 251]) * 65536 for i in range(DATA_BUNDLE)]
    bundle = encode_bundle([Message(v, None, int(time.time() * 1000)) for v in values],
                           codec=Codec.NONE)
    async with open_tank_client(*ctx.target.tank, client_id="soak-setup") as client:
        for _ in range(ctx.caps.data_mib):
            codes = await client.produce_raw([(ctx.data_topic, 0, bundle, None)])
            if codes != [0]:
                raise ClientError(f"could not fill {ctx.data_topic}: code {codes[0]}")
        bounds = (await client.discover_partitions(ctx.data_topic))[0]
    ctx.data_last = bounds.high_water_mark


def consume_frames(topic: str, count: int, seq: int, fetch: int = MiB) -> bytes:
    """``count`` Consume frames (request ids 1..count) of ``topic``/0 from ``seq``."""
    frames = []
    for request_id in range(1, count + 1):
        request = ConsumeRequest(2, request_id, "soak", 0, 0, 0,
                                 [ConsumeTopic(topic, [ConsumePartition(0, seq, fetch)])])
        frames.append(frame(*encode_payload(request)))
    return b"".join(frames)


async def consume_flood(ctx: Context, tally: Tally) -> None:
    """Item 1: connections that pipeline many 1 MiB Consumes of a topic with data and
    never read the answers, each held ``consume_hold`` seconds, then reopened. Most read
    the topic's start, served from its files; a few its last bundle, from the tail
    cache."""
    caps = ctx.caps
    head = consume_frames(ctx.data_topic, caps.consume_pipeline, 1)
    tail = consume_frames(ctx.data_topic, caps.consume_pipeline,
                          max(1, ctx.data_last - DATA_BUNDLE + 1))
    tally.notes["consumes_per_connection"] = caps.consume_pipeline

    async def holder(frames: bytes) -> None:
        for _ in range(caps.consume_rounds):
            stream = await ctx.open(ctx.target.tank, tally)
            if stream is None:
                await trio.sleep(0.5)
                continue
            # The server may stop reading long before all is sent: that is the point.
            with trio.move_on_after(caps.consume_hold) as scope:
                sent = await ctx.send(stream, frames, tally)
            if not sent:
                await close(stream)
                continue
            if scope.cancelled_caught:
                tally.count("connections_not_read_to_the_end")
                await close(stream)
                continue
            await hold_unread(stream, tally, caps.consume_hold)

    async with trio.open_nursery() as nursery:
        for _ in range(caps.consume_connections):
            nursery.start_soon(holder, head)
        for _ in range(caps.consume_tail_connections):
            nursery.start_soon(holder, tail)


async def topic_flood(ctx: Context, tally: Tally) -> None:
    """Items 1 and 7: auto-create many topics by Tank Produce to new names, alongside one
    CreateTopic with very many partitions and one with 64-byte segments, which is then
    produced to one message at a time."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_auto_create, ctx, tally)
        nursery.start_soon(_odd_topics, ctx, tally)


async def _auto_create(ctx: Context, tally: Tally) -> None:
    index = 0
    while index < ctx.caps.auto_topics:
        try:
            async with tank(ctx, tally) as client:
                while index < ctx.caps.auto_topics:
                    name = f"soak-auto-{ctx.run}-{index}"
                    index += 1
                    with trio.fail_after(REQUEST_TIMEOUT):
                        await _count_produce(client, name, "auto_topics", tally)
        except (ClientError, trio.TooSlowError) as exc:
            _note_failure(tally, "auto_topics", exc)
            await trio.sleep(0.5)


async def _count_produce(client: TankClient, topic: str, what: str, tally: Tally) -> None:
    """One message to ``topic``/0, counted as ``<what>_ok`` or ``<what>_refused``."""
    try:
        await client.produce({(topic, 0): [b"soak"]})
    except ProduceFailed as exc:
        tally.count(f"{what}_refused")
        tally.notes.setdefault(f"{what}_first_refusal", str(exc))
        return
    except ClientError as exc:
        if not client.connected:
            raise
        tally.count(f"{what}_refused")
        tally.notes.setdefault(f"{what}_first_refusal", f"{type(exc).__name__}: {exc}")
        return
    tally.count(f"{what}_ok")


def _note_failure(tally: Tally, what: str, exc: BaseException) -> None:
    tally.count(f"{what}_connection_failures")
    tally.notes.setdefault(f"{what}_first_failure", f"{type(exc).__name__}: {exc}")


async def _odd_topics(ctx: Context, tally: Tally) -> None:
    caps = ctx.caps
    try:
        async with tank(ctx, tally) as client:
            if caps.wide_partitions:
                tally.notes["wide_create"] = await _timed_create(
                    client, f"soak-wide-{ctx.run}", caps.wide_partitions, "")
            if caps.tiny_segment_produces:
                tiny = f"soak-tiny-{ctx.run}"
                created = await _timed_create(client, tiny, 1, "log.segment.bytes=64\n")
                tally.notes["tiny_segment_create"] = created
                if created["result"] == "ok":
                    for _ in range(caps.tiny_segment_produces):
                        with trio.fail_after(REQUEST_TIMEOUT):
                            await _count_produce(client, tiny, "tiny_segment_produces", tally)
    except (ClientError, trio.TooSlowError) as exc:
        _note_failure(tally, "odd_topics", exc)


async def _timed_create(client: TankClient, topic: str, partitions: int, config: str
                        ) -> dict[str, Any]:
    """CreateTopic: ``{"result": "ok" | the error, "seconds": ...}``."""
    start = time.monotonic()
    try:
        with trio.fail_after(REQUEST_TIMEOUT * 4):
            await client.create_topic(topic, partitions, config)
        result = "ok"
    except ClientError as exc:
        if not client.connected:
            raise
        result = f"{type(exc).__name__}: {exc}"
    return {"partitions": partitions, "config": config.strip(), "result": result,
            "seconds": round(time.monotonic() - start, 3)}


async def sparse_sequence(ctx: Context, tally: Tally) -> None:
    """Item 5: a Produce whose sparse bundle starts at 2^64 - 3, then normal produces to
    the same partition; records every code (fixed: the sparse one refused with 10 and
    the partition still taking produces), and whether a Figg publish there is ACKed."""
    rounds: list[dict[str, Any]] = []
    tally.notes["sparse_rounds"] = rounds
    for index in range(ctx.caps.sparse_rounds):
        topic = f"soak-seq-{ctx.run}-{index}"
        try:
            async with tank(ctx, tally) as client:
                with trio.fail_after(REQUEST_TIMEOUT):
                    result = await _sparse_round(client, topic)
            result["figg_publish"] = await _figg_publish(ctx, tally, topic)
            rounds.append(result)
        except (ClientError, trio.TooSlowError) as exc:
            _note_failure(tally, "sparse", exc)
        await trio.sleep(5.0)
    codes = [r["sparse_code"] for r in rounds]
    tally.notes["sparse_refused_with_10"] = bool(codes) and all(c == 10 for c in codes)
    tally.notes["partition_keeps_taking_produces"] = bool(rounds) and all(
        r["after_codes"][-1] == 0 and r["figg_publish"] == "acked" for r in rounds)


async def _figg_publish(ctx: Context, tally: Tally, topic: str) -> str:
    """Whether a Figg PUBLISH to ``topic`` is ACKed within 5 s."""
    tally.connections += 1
    async with open_figg_client(*ctx.target.figg, max_refusals=2, connect_timeout=5.0,
                                ping_interval=1.0) as client:
        with trio.move_on_after(5.0):
            try:
                await client.publish_and_wait(topic, b"soak")
            except ClientError as exc:
                return f"{type(exc).__name__}: {exc}"
            return "acked"
    return "no ACK within 5 s"


async def _sparse_round(client: TankClient, topic: str) -> dict[str, Any]:
    now = int(time.time() * 1000)
    plain = encode_bundle([Message(b"soak", None, now)], codec=Codec.NONE)
    first = await client.produce_raw([(topic, 0, plain, None)])
    sparse = encode_bundle([Message(b"sparse", None, now, UINT64_MAX - 2)],
                           codec=Codec.NONE, sparse=True)
    sparse_code = (await client.produce_raw([(topic, 0, sparse, None)]))[0]
    after = [(await client.produce_raw([(topic, 0, plain, None)]))[0] for _ in range(3)]
    return {"topic": topic, "first_code": first[0], "sparse_code": sparse_code,
            "after_codes": after}
