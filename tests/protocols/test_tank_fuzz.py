"""Random and mutated frames through both roles raise nothing but ProtocolError.

Volume comes from a seeded ``random.Random`` (not hypothesis): valid frames (the golden
ones plus randomly built messages) are mutated by flipping bytes, truncating, extending,
inserting or deleting with the length kept right or made wrong, and swapping msgIds.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

from protocols.connection import CLOSED, NEED_DATA, Role
from protocols.errors import ProtocolError
from protocols.tank.connection import TankConnection
from protocols.tank.messages import (
    CODECS,
    ConsumeFlags,
    ConsumePartition,
    ConsumePartitionResult,
    ConsumeRequest,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    Endpoint,
    ProduceError,
    ProducePartition,
    ProducePartitionResult,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResult,
    decode_produce_request,
)
from tests.protocols.test_tank_messages import GOLDEN_REQUESTS, GOLDEN_RESPONSES

SEED = 0x7A4B
CASES_PER_ROLE = 60_000
MAX_FRAME = 1 << 16  # small, so random lengths also exercise FrameTooLarge


def random_produce(rng: random.Random, request_id: int) -> Any:
    return ProduceRequest(rng.choice([0, 2]), request_id, "c++", 0, 0, [
        ProduceTopic(f"t{t}", [ProducePartition(rng.randrange(4), rng.randbytes(rng.randrange(300)))
                               for _ in range(rng.randrange(4))])
        for t in range(rng.randrange(1, 4))])


def random_consume(rng: random.Random, request_id: int) -> Any:
    version = rng.choice([2, 3])
    return ConsumeRequest(version, request_id, "", rng.randrange(1000), 0,
                          rng.randrange(4) if version >= 3 else 0, [
        ConsumeTopic(f"t{t}", [ConsumePartition(p, rng.randrange(1 << 64), 4096)
                               for p in range(rng.randrange(4))])
        for t in range(rng.randrange(1, 4))])


def random_produce_response(rng: random.Random, request: Any) -> Any:
    topics = []
    for topic in request.topics:
        codes = [rng.choice(list(ProduceError)) for _ in topic.partitions]
        if codes and codes[0] in (0xFE, 0xFF):
            codes = [codes[0]] * len(codes)
        topics.append(ProduceTopicResult(topic.name, [
            ProducePartitionResult(p.partition, c,
                                   Endpoint("10.1.2.3", 9) if c == 0xFC else None)
            for p, c in zip(topic.partitions, codes, strict=True)]))
    return ProduceResponse(request.request_id, topics)


def random_consume_response(rng: random.Random, request_id: int) -> Any:
    topics = []
    for t in range(rng.randrange(1, 4)):
        if rng.random() < 0.2:
            topics.append(ConsumeTopicResult(f"t{t}", [], True, rng.randrange(3)))
            continue
        parts = []
        for p in range(rng.randrange(4)):
            flags = rng.choice(list(ConsumeFlags))
            chunk = rng.randbytes(rng.randrange(60))
            if flags in (ConsumeFlags.OK, ConsumeFlags.SPARSE_FIRST_BUNDLE):
                parts.append(ConsumePartitionResult(p, flags, 5, 9, len(chunk), chunk=chunk))
            elif flags == ConsumeFlags.BOUNDARY_CHECK:
                parts.append(ConsumePartitionResult(p, flags, 0, 9, 0, 3))
            elif flags == ConsumeFlags.OTHER_LEADER:
                parts.append(ConsumePartitionResult(p, flags, leader=Endpoint("1.2.3.4", 5)))
            else:
                parts.append(ConsumePartitionResult(p, flags))
        topics.append(ConsumeTopicResult(f"t{t}", parts))
    return ConsumeResponse(request_id, topics)


def corpus(rng: random.Random) -> tuple[list[bytes], list[tuple[Any, bytes]]]:
    """Valid request frames, and (request, response frame) pairs."""
    client, server = TankConnection(Role.CLIENT), TankConnection(Role.SERVER)
    requests = [g.frame for g in GOLDEN_REQUESTS]
    exchanges = [(g.request, g.frame) for g in GOLDEN_RESPONSES]
    for i in range(60):
        produce, consume = random_produce(rng, 2 * i), random_consume(rng, 2 * i + 1)
        requests += [client.send(produce), client.send(consume)]
        exchanges += [(produce, server.send(random_produce_response(rng, produce))),
                      (consume, server.send(random_consume_response(rng, consume.request_id)))]
    return requests, exchanges


def _with_length(buf: bytearray) -> bytearray:
    struct.pack_into("<I", buf, 1, len(buf) - 5)
    return buf


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.randrange(8)
        if op == 0:  # flip bytes anywhere, header included
            for _ in range(rng.randrange(1, 4)):
                if buf:
                    buf[rng.randrange(len(buf))] ^= rng.randrange(1, 256)
        elif op == 1:  # flip payload bytes, length kept
            for _ in range(rng.randrange(1, 4)):
                if len(buf) > 5:
                    buf[rng.randrange(5, len(buf))] ^= rng.randrange(1, 256)
        elif op == 2:  # truncate
            del buf[rng.randrange(len(buf) + 1):]
        elif op == 3:  # extend, length fixed or not
            buf += rng.randbytes(rng.randrange(1, 20))
            if rng.random() < 0.5 and len(buf) >= 5:
                _with_length(buf)
        elif op == 4 and len(buf) >= 5:  # a random length field
            value = rng.choice([0, 1, len(buf) - 6, len(buf) - 4, rng.randrange(1 << 32)])
            struct.pack_into("<I", buf, 1, max(0, value))
        elif op == 5 and len(buf) > 5:  # insert or delete inside the payload, length fixed
            at = rng.randrange(5, len(buf))
            if rng.random() < 0.5:
                buf[at:at] = rng.randbytes(rng.randrange(1, 8))
            else:
                del buf[at:at + rng.randrange(1, 8)]
            _with_length(buf)
        elif op == 6 and buf:  # another msgId
            buf[0] = rng.randrange(0x0E) if rng.random() < 0.9 else rng.randrange(256)
        elif op == 7:  # a random payload under a random msgId
            payload = rng.randbytes(rng.randrange(40))
            buf = bytearray(struct.pack("<BI", rng.randrange(0x0E), len(payload)) + payload)
    return bytes(buf)


def run(conn: TankConnection, data: bytes, rng: random.Random) -> None:
    """Feed ``data`` (maybe split, maybe then EOF) and pull events until nothing is left."""
    cut = rng.randrange(len(data) + 1)
    try:
        for piece in (data[:cut], data[cut:]):
            if not piece:
                continue  # b"" would mean EOF
            conn.receive_data(piece)
            while conn.next_event() is not NEED_DATA:
                pass
        if rng.random() < 0.3:
            conn.receive_data(b"")
            while conn.next_event() is not CLOSED:
                pass
    except ProtocolError:
        pass


def run_case(case: int, conn: TankConnection, data: bytes, rng: random.Random) -> None:
    try:
        run(conn, data, rng)
    except Exception as exc:
        raise AssertionError(f"case {case}: {type(exc).__name__} for {data.hex()}") from exc


def test_random_and_mutated_frames_raise_only_protocol_errors() -> None:
    rng = random.Random(SEED)
    requests, exchanges = corpus(rng)
    for case in range(CASES_PER_ROLE):
        data = mutate(rng, rng.choice(requests))
        run_case(case, TankConnection(Role.SERVER, max_frame_size=MAX_FRAME), data, rng)
    for case in range(CASES_PER_ROLE):
        request, response = rng.choice(exchanges)
        client = TankConnection(Role.CLIENT, max_frame_size=MAX_FRAME)
        client.send(request)
        run_case(case, client, mutate(rng, response), rng)


def outcome(decode: Callable[[bytes], Any], payload: bytes) -> Any:
    """The decoded record, or ProtocolError (any other exception propagates)."""
    try:
        return decode(payload)
    except ProtocolError:
        return ProtocolError


def test_fast_produce_decoder_agrees_on_mutated_payloads() -> None:
    rng = random.Random(SEED + 1)
    requests, _ = corpus(rng)
    produce = [r[5:] for r in requests if r[0] == 0x01]
    engine = CODECS["ProduceRequest"].decode
    for _ in range(20_000):
        payload = mutate(rng, b"\x01" + struct.pack("<I", 0) + rng.choice(produce))[5:]
        assert outcome(decode_produce_request, payload) == outcome(engine, payload), \
            payload.hex()
