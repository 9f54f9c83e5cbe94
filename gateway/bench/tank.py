"""Tank scenarios: ``tank-produce`` and ``tank-consume``."""

from __future__ import annotations

import argparse
import time

import trio

from gateway.bench.endpoints import bounds, ensure_topic, tank_client, unique_topic
from gateway.bench.payload import Payloads
from gateway.bench.procs import Share, WorkerResult
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report, samples, total, wall
from gateway.bench.stats import summarize
from gateway.client.errors import BadResponse, TankError
from gateway.client.tank import CLIENT_VERSION, MAX_FETCH_SIZE, TankClient
from protocols.errors import ProtocolError
from protocols.tank.bundle import Codec, Message, encode_bundle, iter_framed_bundles
from protocols.tank.messages import ConsumePartition, ConsumeRequest, ConsumeTopic
from protocols.tank.types import ConsumeFlags

#: Distinct bundles a producer cycles through (encoding them all would cost memory).
_BUNDLE_POOL = 32
_MIB = 1024 * 1024


def _codec(name: str) -> Codec:
    return Codec.SNAPPY if name == "snappy" else Codec.NONE


def _bundle_sizes(messages: int, per_bundle: int) -> list[int]:
    full, rest = divmod(messages, per_bundle)
    return [per_bundle] * full + ([rest] if rest else [])


def _make_batches(payloads: Payloads, sizes: list[int], first_index: int
                  ) -> list[list[Message]]:
    """Message lists for the first distinct bundles (the rest reuse them in turn) and
    for a last, shorter bundle."""
    now = time.time_ns() // 1_000_000
    wanted = sorted(set(range(min(len(sizes), _BUNDLE_POOL))) | {len(sizes) - 1})
    batches, index = [], first_index
    for j in wanted:
        batches.append([Message(payloads.body(index + i), timestamp=now)
                        for i in range(sizes[j])])
        index += sizes[j]
    return batches


async def _pipelined_produce(client: TankClient, topic: str, sizes: list[int],
                             batches: list[list[Message]], codec: Codec, in_flight: int,
                             client_encode: bool) -> tuple[list[float], int]:
    """Send one Produce per entry of ``sizes``, ``in_flight`` at a time; returns the
    request latencies and the messages refused by the broker."""
    pooled = min(len(sizes), _BUNDLE_POOL)
    encoded = [] if client_encode else [encode_bundle(b, codec=codec) for b in batches]
    latencies: list[float] = []
    failed = 0
    slots = trio.Semaphore(in_flight)

    async def one(j: int) -> None:
        nonlocal failed
        k = len(batches) - 1 if j == len(sizes) - 1 else j % pooled
        sent = time.perf_counter()
        try:
            if client_encode:
                await client.produce({(topic, 0): batches[k]}, codec=codec)
            else:
                await client.produce_bundles({(topic, 0): encoded[k]})
        except TankError:
            failed += sizes[j]
        else:
            latencies.append(time.perf_counter() - sent)
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        for j in range(len(sizes)):
            await slots.acquire()
            nursery.start_soon(one, j)
    return latencies, failed


# ----------------------------------------------------------------------- tank-produce


def _add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=200_000, help="messages in all")
    parser.add_argument("--size", type=int, default=100, help="bytes per message")
    parser.add_argument("--bundle", type=int, default=100, help="messages per bundle")
    parser.add_argument("--in-flight", type=int, default=8,
                        help="Produce requests in flight per process")
    parser.add_argument("--compression", choices=("none", "snappy"), default="none")
    parser.add_argument("--client-encode", action="store_true",
                        help="encode each bundle in the timed loop, as a producing "
                             "application does (default: bundles encoded beforehand, "
                             "which measures the broker rather than the encoder)")


def _produce_params(args: argparse.Namespace) -> Params:
    return {"messages": args.messages, "size": args.size, "bundle": args.bundle,
            "in_flight": args.in_flight, "compression": args.compression,
            "client_encode": args.client_encode}


async def _produce_prepare(params: Params) -> Params:
    topic = params["topic"] or unique_topic("bench-produce")
    async with tank_client(params["tank"]) as client:
        await ensure_topic(client, topic)
        _, hwm = await bounds(client, topic)
    return {**params, "topic": topic, "hwm_before": hwm}


async def _produce_work(params: Params, share: Share) -> WorkerResult:
    first, count = share.part(params["messages"])
    sizes = _bundle_sizes(count, params["bundle"])
    if not sizes:
        await share.start()
        return share.finish({"messages": 0, "bytes": 0, "failed": 0})
    payloads = Payloads(params["seed"], params["size"], compressible=params["compressible"])
    batches = _make_batches(payloads, sizes, first)
    async with tank_client(params["tank"]) as client:
        await share.start()
        latencies, failed = await _pipelined_produce(
            client, params["topic"], sizes, batches, _codec(params["compression"]),
            params["in_flight"], params["client_encode"])
        return share.finish({"messages": count - failed, "bytes": (count - failed)
                             * params["size"], "failed": failed, "requests": len(sizes)},
                            {"request": latencies})


async def _produce_finish(params: Params, results: list[WorkerResult]) -> Report:
    async with tank_client(params["tank"]) as client:
        _, hwm = await bounds(client, params["topic"])
    stored = hwm - params["hwm_before"]
    sent = total(results, "messages")
    failed = total(results, "failed")
    row = Row("produce", sent, wall(results), total(results, "bytes"),
              summarize(samples(results, "request")), "request")
    check = Check("high-water mark advanced by", params["messages"], stored,
                  problem=f"the broker refused {failed:,} messages" if failed else "")
    return make_report("tank-produce", params, results, [row], [check])


# ----------------------------------------------------------------------- tank-consume


def _add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=200_000,
                        help="messages to prepare in a new topic before reading it")
    parser.add_argument("--size", type=int, default=1000, help="bytes per message")
    parser.add_argument("--bundle", type=int, default=100,
                        help="messages per bundle when preparing")
    parser.add_argument("--compression", choices=("none", "snappy"), default="none",
                        help="codec of the prepared bundles")
    parser.add_argument("--fetch-size", type=int, default=_MIB,
                        help="bytes asked per Consume")
    parser.add_argument("--raw", action="store_true",
                        help="count messages from bundle headers instead of decoding them: "
                             "measures the broker's send path, not the client's decoder "
                             "(MB/s then counts chunk bytes)")
    parser.add_argument("--existing", action="store_true",
                        help="read --topic as it is instead of preparing a topic")
    parser.add_argument("--expect", type=int, default=None,
                        help="messages the topic must hold (default: as many as were "
                             "prepared; with --existing, what the broker reports)")


def _consume_params(args: argparse.Namespace) -> Params:
    if args.existing and not args.topic:
        raise ValueError("--existing needs --topic")
    return {"messages": 0 if args.existing else args.messages, "size": args.size,
            "bundle": args.bundle, "compression": args.compression,
            "fetch_size": args.fetch_size, "existing": args.existing, "expect": args.expect,
            "raw": args.raw}


async def _consume_prepare(params: Params) -> Params:
    topic = params["topic"] if params["existing"] else (
        params["topic"] or unique_topic("bench-consume"))
    async with tank_client(params["tank"]) as client:
        if not params["existing"]:
            await ensure_topic(client, topic)
            sizes = _bundle_sizes(params["messages"], params["bundle"])
            if sizes:
                payloads = Payloads(params["seed"], params["size"],
                                    compressible=params["compressible"])
                await _pipelined_produce(client, topic, sizes, _make_batches(payloads, sizes, 0),
                                         _codec(params["compression"]), 8, False)
        first, last = await bounds(client, topic)
    expect = params["expect"]
    if expect is None:
        expect = params["messages"] if not params["existing"] else last - first + 1
    return {**params, "topic": topic, "first_seq": first, "last_seq": last, "expect": expect}


async def _consume_range(client: TankClient, topic: str, seq: int, end: int,
                         fetch_size: int) -> tuple[dict[str, int], list[float]]:
    """Read ``seq..end``; counts of messages, bytes, gaps and repeats, fetch latencies."""
    got = size = gaps = repeats = 0
    latencies: list[float] = []
    expected = seq
    while seq <= end:
        sent = time.perf_counter()
        result = await client.consume(topic, 0, seq, fetch_size=fetch_size)
        latencies.append(time.perf_counter() - sent)
        messages = result.messages
        if not messages:
            break  # the partition ends before ``end``: the rest counts as lost
        if messages[-1].seq > end:
            messages = [m for m in messages if m.seq <= end]
        if (messages and messages[0].seq == expected
                and messages[-1].seq - expected + 1 == len(messages)):
            expected += len(messages)  # contiguous: the common case
        else:
            for m in messages:
                if m.seq < expected:
                    repeats += 1
                    continue
                gaps += m.seq - expected
                expected = m.seq + 1
        got += len(messages)
        size += sum(len(m.value) for m in messages)
        seq = max(result.next_seq, seq + 1)
    return {"messages": got - repeats, "bytes": size, "gaps": gaps,
            "repeats": repeats}, latencies


async def _raw_chunk(client: TankClient, topic: str, seq: int, fetch_size: int
                     ) -> tuple[int, bytes]:
    """One Consume answered without decoding: ``(base_seq, chunk)``."""
    def build(request_id: int) -> ConsumeRequest:
        return ConsumeRequest(CLIENT_VERSION, request_id, client.client_id, 0, 0, 0,
                              [ConsumeTopic(topic, [ConsumePartition(0, seq, fetch_size)])])

    response = await client.request(build)
    [part] = response.topics[0].partitions
    if part.flags != ConsumeFlags.OK:
        raise BadResponse(f"{topic}: Consume from {seq} answered with flags {part.flags:#x} "
                          "(--raw reads only plain, non-sparse bundles)")
    return part.base_seq_num, bytes(part.chunk or b"")


async def _consume_range_raw(client: TankClient, topic: str, seq: int, end: int,
                             fetch_size: int) -> tuple[dict[str, int], list[float]]:
    """:func:`_consume_range` counting messages from bundle headers; ``bytes`` are chunk
    bytes."""
    got = size = gaps = 0
    latencies: list[float] = []
    while seq <= end:
        sent = time.perf_counter()
        base, chunk = await _raw_chunk(client, topic, seq, fetch_size)
        latencies.append(time.perf_counter() - sent)
        if not chunk:
            break
        if base > seq:
            gaps += base - seq
        bundle_seq, whole = base, 0
        try:
            for _, length, info in iter_framed_bundles(chunk):
                if info.sparse:
                    raise BadResponse(f"{topic}: --raw can not count a sparse bundle")
                low, high = max(bundle_seq, seq), min(bundle_seq + info.msg_count - 1, end)
                got += max(0, high - low + 1)
                bundle_seq += info.msg_count
                whole += length
        except ProtocolError as exc:
            raise BadResponse(f"{topic}: corrupt chunk: {exc}") from None
        if not whole:  # a partial bundle only (a TANK 1 broker cuts at the fetch size)
            if fetch_size >= MAX_FETCH_SIZE:
                raise BadResponse(f"{topic}: a bundle larger than {MAX_FETCH_SIZE} bytes")
            fetch_size *= 2
            continue
        size += whole
        seq = max(bundle_seq, seq)
    return {"messages": got, "bytes": size, "gaps": gaps, "repeats": 0}, latencies


async def _consume_work(params: Params, share: Share) -> WorkerResult:
    span = max(0, params["last_seq"] - params["first_seq"] + 1)
    offset, count = share.part(span)
    start = params["first_seq"] + offset
    async with tank_client(params["tank"]) as client:
        await share.start()
        read = _consume_range_raw if params["raw"] else _consume_range
        counts, latencies = await read(client, params["topic"], start, start + count - 1,
                                       params["fetch_size"])
        return share.finish(counts, {"fetch": latencies})


async def _consume_finish(params: Params, results: list[WorkerResult]) -> Report:
    got = total(results, "messages")
    gaps = total(results, "gaps")
    row = Row("consume (raw chunks)" if params["raw"] else "consume", got, wall(results),
              total(results, "bytes"), summarize(samples(results, "fetch")), "fetch",
              note="MB/s of chunk bytes, messages counted from bundle headers"
              if params["raw"] else "")
    check = Check("read from the first sequence to the end", params["expect"], got,
                  duplicates=total(results, "repeats"),
                  problem=f"{gaps:,} sequence numbers missing" if gaps else "")
    return make_report("tank-consume", params, results, [row], [check])


SCENARIOS = (
    Scenario("tank-produce", "Tank: produce N messages of S bytes in bundles of B, "
             "K requests in flight", _add_produce_arguments, _produce_params,
             _produce_work, _produce_finish, _produce_prepare, frozenset({"tank"})),
    Scenario("tank-consume", "Tank: read a prepared topic from its first sequence to "
             "the end", _add_consume_arguments, _consume_params, _consume_work,
             _consume_finish, _consume_prepare, frozenset({"tank"})),
)
