"""figtank's own Kafka client, piece by piece, against a real upstream process (a
``figtank serve`` Kafka listener): pipelined requests on one connection, a lost
connection failing every waiting call, SCRAM and PLAIN logins, the idempotent producer's
batches and sequences, and fetches turned into bundles; and against scripted brokers on
loopback: an answer that never comes, large answers in pieces, one cut short."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio

from gateway.backend.kafka.cluster import Cluster
from gateway.backend.kafka.fetcher import fetch_partition
from gateway.backend.kafka.produce import UpstreamProducer
from gateway.backend.kafka.wire import (
    AuthenticationFailed,
    BrokerConnection,
    BrokerLost,
    Security,
    open_broker,
)
from gateway.client.tls import client_context
from gateway.core.contract import ProduceCode, ProduceOutcome
from protocols.kafka.codecs import Compression
from protocols.kafka.messages import RESPONSES
from protocols.kafka.records import (
    CreatableTopic,
    CreateTopicsRequest,
    FetchableTopicResponse,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    ListOffsetsTopicResponse,
    PartitionData,
)
from protocols.kafka.types import ApiKey
from protocols.tank.bundle import (
    Codec,
    Message,
    decode_chunk,
    encode_bundle,
    parse_bundle_header,
)
from protocols.wire import decode_varint
from tests.tls_certs import Certs
from tests.upstream_kafka.helpers import GATEWAY_PASSWORD, GATEWAY_USER, SecuredUpstream, Upstream


@asynccontextmanager
async def _cluster(address: str) -> AsyncIterator[Cluster]:
    host, _, port = address.rpartition(":")
    async with trio.open_nursery() as nursery:
        cluster = Cluster([(host, int(port))], nursery, security=Security(), client_id="test",
                          timeout=5)
        try:
            yield cluster
        finally:
            cluster.close()
            nursery.cancel_scope.cancel()


async def _create(cluster: Cluster, topic: str, partitions: int = 1) -> None:
    connection = await cluster.any_broker()
    answer = await connection.call(ApiKey.CREATE_TOPICS, CreateTopicsRequest(
        topics=[CreatableTopic(name=topic, num_partitions=partitions, replication_factor=-1)],
        timeout_ms=5000))
    assert answer.topics[0].error_code == 0


@asynccontextmanager
async def _producing(tmp_path: Path, topic: str, partitions: int = 1,
                     compression: Compression | None = None
                     ) -> AsyncIterator[tuple[Cluster, UpstreamProducer]]:
    """A stand-in upstream with ``topic``, and a running producer to it."""
    upstream = Upstream(tmp_path / "up")
    try:
        await upstream.served.start()
        async with _cluster(upstream.address) as cluster, trio.open_nursery() as nursery:
            await _create(cluster, topic, partitions)
            await cluster.metadata([topic])
            producer = UpstreamProducer(cluster, compression=compression)
            await nursery.start(producer.run)
            yield cluster, producer
            nursery.cancel_scope.cancel()
    finally:
        upstream.served.close()


async def test_many_requests_in_flight_on_one_connection_get_their_own_answers(
        tmp_path: Path) -> None:
    upstream = Upstream(tmp_path / "up")
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            async with _cluster(upstream.address) as cluster:
                names = [f"t{i}" for i in range(20)]
                async with trio.open_nursery() as nursery:
                    for i, name in enumerate(names):
                        nursery.start_soon(_create, cluster, name, i % 3 + 1)
                connection = await cluster.any_broker()
                answers: dict[str, int] = {}

                async def partitions_of(name: str) -> None:
                    answer = await cluster.metadata([name])
                    answers[name] = len(answer.topics[0].partitions)

                async with trio.open_nursery() as nursery:
                    for name in names:
                        nursery.start_soon(partitions_of, name)
                # One connection carried them all, and each answer is its own request's.
                assert await cluster.any_broker() is connection
                assert answers == {name: i % 3 + 1 for i, name in enumerate(names)}
    finally:
        upstream.served.close()


async def test_a_lost_connection_fails_every_waiting_call_and_the_next_reconnects(
        tmp_path: Path) -> None:
    upstream = Upstream(tmp_path / "up")
    try:
        with trio.fail_after(60):
            await upstream.served.start()
            async with _cluster(upstream.address) as cluster:
                await _create(cluster, "lost")
                connection = await cluster.leader("lost", 0)
                failures: list[BaseException] = []

                async def long_poll() -> None:
                    try:
                        await fetch_partition(cluster, "lost", 0, 0, max_wait_ms=20_000,
                                              max_bytes=1024, after_seq=None, timeout=5)
                    except BrokerLost as exc:
                        failures.append(exc)

                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(long_poll)
                    await trio.sleep(0.5)
                    assert connection.in_flight == 3
                    await upstream.served.kill()
                assert len(failures) == 3 and connection.lost is not None
                with pytest.raises(BrokerLost):
                    await cluster.metadata(["lost"])
                await upstream.served.start()
                answer = await cluster.metadata(["lost"])
                assert answer.topics[0].name == "lost"
                assert await cluster.any_broker() is not connection
    finally:
        upstream.served.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_tls_and_sasl_logins(tmp_path: Path, certs: Certs, mechanism: str) -> None:
    upstream = SecuredUpstream(tmp_path / "up", certs)
    host, _, port = upstream.address.rpartition(":")
    context = client_context(ca=certs.ca_pem)
    try:
        with trio.fail_after(60):
            up = await upstream.served.start()
            async with trio.open_nursery() as nursery:
                good = await open_broker(host, int(port), nursery, security=Security(
                    context, mechanism, GATEWAY_USER, GATEWAY_PASSWORD),
                    client_id="test", timeout=5)
                answer = await good.call(ApiKey.LIST_OFFSETS, ListOffsetsRequest(
                    replica_id=-1, topics=[ListOffsetsTopic("none", [
                        ListOffsetsPartition(partition_index=0, timestamp=-1)])]))
                assert answer.topics[0].name == "none"
                with pytest.raises(AuthenticationFailed, match="SASL authentication error"):
                    await open_broker(host, int(port), nursery, security=Security(
                        context, mechanism, GATEWAY_USER, "wrong"),
                        client_id="test", timeout=5)
                with pytest.raises(AuthenticationFailed, match="TLS handshake"):
                    await open_broker(host, int(port), nursery, security=Security(
                        client_context(), mechanism, GATEWAY_USER, GATEWAY_PASSWORD),
                        client_id="test", timeout=5)
                good.close("done")
                nursery.cancel_scope.cancel()
            logins = up.events("sasl_authenticated")
            assert [(e["user"], e["mechanism"]) for e in logins] == [(GATEWAY_USER, mechanism)]
    finally:
        upstream.served.close()


async def test_the_producer_merges_a_partitions_queue_into_one_batch_in_order(
        tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with _producing(tmp_path, "merged", 2) as (cluster, producer):
            outcomes: dict[tuple[int, int], ProduceOutcome] = {}
            sent = {0: [], 1: []}  # type: dict[int, list[bytes]]
            for i in range(200):
                partition = i % 2
                # (~90 KB a partition: merged Snappy batches span several of
                # snappy-java's 32 KiB blocks, which the gateway writes as one)
                values = [b"%d-%d." % (i, j) + b"v" * 300 for j in range(i % 5 + 1)]
                sent[partition] += values
                bundle = encode_bundle([Message(v, b"k" if j % 2 else None, 1_000 + i)
                                        for j, v in enumerate(values)],
                                       codec=Codec.SNAPPY if i % 3 else Codec.NONE)
                producer.send("merged", partition, bundle, len(values),
                              lambda o, key=(partition, i): outcomes.__setitem__(key, o))
            assert await producer.flush(trio.current_time() + 20) == 0
            assert len(outcomes) == 200
            assert all(o.code is ProduceCode.OK for o in outcomes.values())
            for partition in (0, 1):
                # Each bundle's sequences follow the previous one's: offsets + 1.
                ranges = [(o.first_seq, o.last_seq) for (p, _), o in sorted(
                    outcomes.items(), key=lambda kv: kv[0][1]) if p == partition]
                assert ranges[0][0] == 1
                assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
                got = await fetch_partition(cluster, "merged", partition, 0,
                                            max_wait_ms=0, max_bytes=1 << 20,
                                            after_seq=None, timeout=5)
                chunk = b"".join(b.framed for b in got.bundles)
                messages = decode_chunk(chunk, 1, max_bundle_size=1 << 20).messages
                assert [m.value for m in messages] == sent[partition]
                assert ranges[-1][1] == len(sent[partition])
                # Fewer batches than bundles: queued bundles went out together.
                assert len(got.bundles) < 100
            assert producer.producer_ids == 1


def _stored_codecs(partition_dir: Path) -> list[Codec]:
    """The codec of each bundle in the partition's segment (up to the zeros an fsync-mode
    segment is prefilled with)."""
    (log,) = partition_dir.glob("*.log")
    data = log.read_bytes()
    codecs = []
    pos = 0
    while pos < len(data) and data[pos]:
        decoded = decode_varint(data, pos, len(data))
        assert decoded is not None
        length, start = decoded
        codecs.append(parse_bundle_header(data[start:start + length]).codec)
        pos = start + length
    return codecs


@pytest.mark.parametrize(("compression", "stored"), [
    (None, [Codec.NONE, Codec.SNAPPY]),  # the producer's choice: as each client sent it
    (Compression.NONE, [Codec.NONE, Codec.NONE]),
    (Compression.LZ4, [Codec.SNAPPY, Codec.SNAPPY]),  # any Kafka codec: Tank's Snappy
])
async def test_batches_go_up_compressed_as_the_client_compressed_them_by_default(
        tmp_path: Path, compression: Compression | None, stored: list[Codec]) -> None:
    with trio.fail_after(60):
        async with _producing(tmp_path, "codecs", compression=compression) as (cluster, producer):
            sent: list[bytes] = []
            for codec in (Codec.NONE, Codec.SNAPPY):
                values = [b"%s-%d" % (codec.name.encode(), i) * 20 for i in range(500)]
                sent += values
                producer.send("codecs", 0, encode_bundle(
                    [Message(v, None, 1_000) for v in values], codec=codec), len(values),
                    lambda o: None)
                # One batch each: the upstream stores each batch as one bundle.
                assert await producer.flush(trio.current_time() + 20) == 0
            assert _stored_codecs(tmp_path / "up" / "codecs" / "0") == stored
            got = await fetch_partition(cluster, "codecs", 0, 0, max_wait_ms=0,
                                        max_bytes=1 << 20, after_seq=None, timeout=5)
            chunk = b"".join(b.framed for b in got.bundles)
            messages = decode_chunk(chunk, 1, max_bundle_size=1 << 20).messages
            assert [m.value for m in messages] == sent


async def test_a_bundle_that_does_not_convert_is_refused_alone(tmp_path: Path) -> None:
    """The front ends check a bundle's header only; the producer's conversion reads its
    messages. A corrupt one queued between two good ones of the same partition (one
    batch) is refused by itself, and the good ones go up in order."""
    with trio.fail_after(60):
        async with _producing(tmp_path, "mixed") as (cluster, producer):
            good = [encode_bundle([Message(b"good-%d-%d" % (n, i), None, 1_000)
                                   for i in range(20)], codec=Codec.SNAPPY)
                    for n in (1, 2)]
            corrupt = bytearray(encode_bundle([Message(b"bad-%d" % i, None, 1_000)
                                               for i in range(20)], codec=Codec.SNAPPY))
            corrupt[len(corrupt) - 12:] = b"\xff" * 12  # the header still reads
            outcomes: list[ProduceOutcome] = []
            for bundle in (good[0], bytes(corrupt), good[1]):
                producer.send("mixed", 0, bundle, 20, outcomes.append, kick=False)
            producer.kick()
            assert await producer.flush(trio.current_time() + 20) == 0
            by_code = sorted((o.code, o.first_seq) for o in outcomes)
            assert [code for code, _ in by_code] == [ProduceCode.OK, ProduceCode.OK,
                                                     ProduceCode.IO_FAULT]
            refused = next(o for o in outcomes if o.code is ProduceCode.IO_FAULT)
            assert refused.reason.startswith("invalid bundle")
            got = await fetch_partition(cluster, "mixed", 0, 0, max_wait_ms=0,
                                        max_bytes=1 << 20, after_seq=None, timeout=5)
            chunk = b"".join(b.framed for b in got.bundles)
            values = [m.value for m in decode_chunk(chunk, 1, max_bundle_size=1 << 20
                                                    ).messages]
            assert values == [b"good-%d-%d" % (n, i) for n in (1, 2) for i in range(20)]


async def _connected_to(nursery: trio.Nursery,
                        handler: Callable[[trio.SocketStream], Awaitable[None]]
                        ) -> BrokerConnection:
    """A connection (reading, writing and watching in ``nursery``) to a scripted broker
    on loopback that serves each connection with ``handler``."""
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    connection = BrokerConnection(stream, f"127.0.0.1:{port}", client_id="t", timeout=5)
    nursery.start_soon(connection.run)
    nursery.start_soon(connection.write)
    nursery.start_soon(connection.watch)
    return connection


async def test_an_answer_that_does_not_come_closes_the_connection_in_time() -> None:
    """A broker that takes requests and never answers: the waiting call and the request
    whose answer goes to a callback both get BrokerLost at their deadline (the
    connection's watchdog), and the connection is not used again."""
    received = bytearray()

    async def silent(stream: trio.SocketStream) -> None:
        async for data in stream:
            received.extend(data)

    async with trio.open_nursery() as nursery:
        connection = await _connected_to(nursery, silent)
        handed: list[tuple[object, BaseException | None]] = []
        request = ListOffsetsRequest(replica_id=-1, topics=[])
        started = trio.current_time()
        connection.submit(ApiKey.LIST_OFFSETS, request, version=1, timeout=0.3,
                          on_answer=lambda answer, error: handed.append((answer, error)))
        with trio.fail_after(5), pytest.raises(BrokerLost, match="in time"):
            await connection.call(ApiKey.LIST_OFFSETS, request, version=1, timeout=2)
        waited = trio.current_time() - started
        # The first deadline (0.3 s) closed the connection: both requests failed then.
        assert 0.25 <= waited < 1.5, waited
        assert len(handed) == 1 and handed[0][0] is None
        assert isinstance(handed[0][1], BrokerLost)
        assert connection.lost is not None and connection.in_flight == 0
        assert len(received) > 0  # the requests were written
        with pytest.raises(BrokerLost):
            connection.submit(ApiKey.LIST_OFFSETS, request, version=1)
        nursery.cancel_scope.cancel()


async def _answering_broker(stream: trio.SocketStream, answers: list[bytes], *,
                            piece: int, close_after: int | None = None,
                            first: int = 0) -> None:
    """Read one request per answer, then write every answer back to back (each framed
    with its request's correlation id): the first ``first`` bytes alone, then the rest in
    pieces of ``piece`` bytes; ``close_after``: close the connection once that many bytes
    are written."""
    received, correlations = bytearray(), []
    while len(correlations) < len(answers):
        received += await stream.receive_some(65536)
        while len(received) >= 4 and len(received) >= 4 + int.from_bytes(received[:4]):
            size = int.from_bytes(received[:4])
            correlations.append(int.from_bytes(received[8:12]))  # after key, version
            del received[:4 + size]
    out = b"".join(len(payload).to_bytes(4) + c.to_bytes(4) + payload[4:]
                   for c, payload in zip(correlations, answers, strict=True))
    if close_after is not None:
        out = out[:close_after]
    if first:
        await stream.send_all(out[:first])
        await trio.sleep(0.05)  # read alone
    for start in range(first, len(out), piece):
        await stream.send_all(out[start:start + piece])
        await trio.sleep(0)
    if close_after is not None:
        await stream.aclose()
    else:
        await trio.sleep_forever()


def _answer_payload(api_key: int, record: object, version: int) -> bytes:
    """Four bytes where the correlation id goes, then the answer's body."""
    return bytes(4) + RESPONSES[api_key].encode(record, version=version)


#: The two calls of the large-answer tests, by name: what each asks.
_CALLS = {"fetch": (ApiKey.FETCH, FetchRequest(), 11),
          "offsets": (ApiKey.LIST_OFFSETS, ListOffsetsRequest(replica_id=-1, topics=[]), 1)}


async def _called_in_order(connection: BrokerConnection, *names: str) -> dict[str, object]:
    """The answers to :data:`_CALLS`, made in the order of ``names`` (so their answers
    come in that order on the wire)."""
    got: dict[str, object] = {}

    async def call(name: str) -> None:
        api_key, request, version = _CALLS[name]
        got[name] = await connection.call(api_key, request, version=version)

    with trio.fail_after(10):
        async with trio.open_nursery() as calls:
            for name in names:
                calls.start_soon(call, name)
                await trio.sleep(0.05)
    return got


#: A Fetch answer of 600 KB (read to its end past the connection's buffer), and a small
#: ListOffsets answer: their bodies.
_RECORDS = bytes(range(256)) * 2400
_ANSWERS = {
    "fetch": _answer_payload(ApiKey.FETCH, FetchResponse(responses=[FetchableTopicResponse(
        topic="t", partitions=[PartitionData(partition_index=0, high_watermark=9,
                                             records=_RECORDS)])]), 11),
    "offsets": _answer_payload(ApiKey.LIST_OFFSETS, ListOffsetsResponse(
        topics=[ListOffsetsTopicResponse(name="t")]), 1)}


@pytest.mark.parametrize(("order", "piece", "split"), [
    (("fetch", "offsets"), 7_777, 0),
    (("fetch", "offsets"), 1 << 20, 0),
    *((("offsets", "fetch"), 65536, split) for split in range(1, 6))])
async def test_a_large_answer_and_a_small_one_each_reach_their_call(
        order: tuple[str, str], piece: int, split: int) -> None:
    """The two answers back to back, in pieces that straddle the boundary between them;
    ``split``: the small one first, with the first ``split`` bytes of the large one's
    frame (its size cut in two for 1-3), the rest after."""
    answers = [_ANSWERS[name] for name in order]
    first = 4 + len(answers[0]) + split if split else 0
    async with trio.open_nursery() as nursery:
        connection = await _connected_to(nursery, partial(
            _answering_broker, answers=answers, piece=piece, first=first))
        got = await _called_in_order(connection, *order)
        answer = got["fetch"]
        assert isinstance(answer, FetchResponse)
        assert bytes(answer.responses[0].partitions[0].records or b"") == _RECORDS
        assert isinstance(got["offsets"], ListOffsetsResponse)
        assert got["offsets"].topics[0].name == "t"
        assert connection.lost is None
        nursery.cancel_scope.cancel()


async def test_a_large_answer_cut_short_by_the_broker_fails_its_call() -> None:
    records = bytes(600_000)
    fetch = FetchResponse(responses=[FetchableTopicResponse(topic="t", partitions=[
        PartitionData(partition_index=0, records=records)])])
    answers = [_answer_payload(ApiKey.FETCH, fetch, 11)]
    async with trio.open_nursery() as nursery:
        connection = await _connected_to(nursery, partial(
            _answering_broker, answers=answers, piece=65536, close_after=400_000))
        with trio.fail_after(10), pytest.raises(BrokerLost, match="closed the connection"):
            await connection.call(ApiKey.FETCH, FetchRequest(), version=11)
        nursery.cancel_scope.cancel()
