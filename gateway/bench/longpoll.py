"""Many long polls at one partition's tail, woken by each append: server CPU per message.

``python -m gateway.bench.longpoll --pid PID --tank HOST:PORT [--kafka HOST:PORT]`` opens
``--clients`` connections (Tank Consume or Kafka Fetch long polls, all at the same
position of partition 0 of a fresh topic) and one Tank producer. Each round the producer
appends one message and waits until every client has it and has sent its next long poll
(plus ``--settle`` ms, so the polls are parked again), so every append wakes all of them
at once: the case issue 27 item 3's shared fan-out is for. The server's CPU (utime +
stime from ``/proc/PID/stat``) is read around the timed rounds, after ``--warmup`` rounds,
and reported per delivered message (the producer's Produce included).

The clients are lean on purpose (requests encoded once per round, responses read only as
far as the high-water mark), so the load generator takes little of a shared machine: the
figure is the server's. Every client checks that it got each message exactly once.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
import uuid
from typing import Any

import trio

from gateway.bench.endpoints import ensure_topic, tank_client
from gateway.bench.procs import process_cpu_seconds
from gateway.core.config import parse_address
from protocols.kafka.messages import (
    REQUESTS,
    RESPONSES,
    request_header_version,
    response_header_version,
)
from protocols.kafka.records import (
    FetchPartition,
    FetchRequest,
    FetchTopic,
    RequestHeader,
    encode_request_header,
    read_response_header,
)
from protocols.kafka.types import ApiKey
from protocols.tank.bundle import Message

_TANK_HEAD = struct.Struct("<BI")
_CONSUME = 2
_FETCH_SIZE = 1 << 20
#: The Fetch version the Kafka clients send (librdkafka 2.x's).
_FETCH_VERSION = 11


class _Rounds:
    """How many clients got the current round's message (the producer waits for all)."""

    def __init__(self, clients: int) -> None:
        self.clients = clients
        self.done = 0
        self.event = trio.Event()
        self.delivered = 0

    def got(self, messages: int) -> None:
        self.delivered += messages
        self.done += 1
        if self.done >= self.clients:
            self.event.set()

    def reset(self) -> None:
        self.done = 0
        self.event = trio.Event()


def _consume_request(request_id: int, topic: bytes, seq: int, max_wait_ms: int) -> bytes:
    payload = (struct.pack("<HI", 2, request_id) + b"\x05bench"
               + struct.pack("<QIB", max_wait_ms, 0, 1) + bytes([len(topic)]) + topic
               + struct.pack("<BHQI", 1, 0, seq, _FETCH_SIZE))
    return _TANK_HEAD.pack(_CONSUME, len(payload)) + payload


async def _read_exactly(stream: trio.SocketStream, buf: bytearray, size: int) -> bytes:
    while len(buf) < size:
        data = await stream.receive_some(1 << 18)
        if not data:
            raise EOFError("the server closed the connection")
        buf += data
    out = bytes(buf[:size])
    del buf[:size]
    return out


async def _tank_client(address: str, topic: str, seq: int, rounds: _Rounds,
                       max_wait_ms: int) -> None:
    """Long-poll partition 0 of ``topic`` from ``seq``; count each message once."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    name = topic.encode()
    buf = bytearray()
    request_id = 0
    async with stream:
        while True:
            request_id += 1
            await stream.send_all(_consume_request(request_id, name, seq, max_wait_ms))
            while True:
                msg_id, size = _TANK_HEAD.unpack(await _read_exactly(stream, buf, 5))
                payload = await _read_exactly(stream, buf, size)
                if msg_id == _CONSUME:
                    break
            pos = 8 + 1 + 1 + len(name) + 1 + 2
            flag = payload[pos]
            pos += 1
            if flag == 0:
                _, hwm, chunk = struct.unpack_from("<QQI", payload, pos)
            elif flag == 0xFE:
                hwm, chunk = struct.unpack_from("<QI", payload, pos)
            else:
                raise RuntimeError(f"consume flag {flag:#x}")
            if not chunk:
                continue  # the long poll timed out: poll again
            if chunk >= _FETCH_SIZE:
                raise RuntimeError("a chunk filled the fetch size: messages left behind")
            rounds.got(hwm + 1 - seq)
            seq = hwm + 1


def _fetch_request(correlation_id: int, topic: str, offset: int, max_wait_ms: int) -> bytes:
    header = encode_request_header(RequestHeader(ApiKey.FETCH, _FETCH_VERSION, correlation_id,
                                                 "bench"),
                                   request_header_version(ApiKey.FETCH, _FETCH_VERSION))
    body = REQUESTS[ApiKey.FETCH].encode(FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=_FETCH_SIZE * 4,
        topics=[FetchTopic(topic, [FetchPartition(partition=0, fetch_offset=offset,
                                                  partition_max_bytes=_FETCH_SIZE)])]),
        version=_FETCH_VERSION)
    return struct.pack(">i", len(header) + len(body)) + header + body


async def _kafka_client(address: str, topic: str, offset: int, rounds: _Rounds,
                        max_wait_ms: int) -> None:
    """Long-poll partition 0 of ``topic`` by Kafka Fetch from ``offset``."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    buf = bytearray()
    correlation_id = 0
    decode = RESPONSES[ApiKey.FETCH].decode
    header_version = response_header_version(ApiKey.FETCH, _FETCH_VERSION)
    async with stream:
        while True:
            correlation_id += 1
            await stream.send_all(_fetch_request(correlation_id, topic, offset, max_wait_ms))
            (size,) = struct.unpack(">i", await _read_exactly(stream, buf, 4))
            payload = await _read_exactly(stream, buf, size)
            _, pos = read_response_header(payload, 0, len(payload), header_version)
            part = decode(payload[pos:], version=_FETCH_VERSION).responses[0].partitions[0]
            if part.error_code:
                raise RuntimeError(f"fetch error {part.error_code}")
            if not part.records:
                continue
            rounds.got(part.high_watermark - offset)
            offset = part.high_watermark


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """One measured run; the figures as a dict."""
    topic = f"longpoll-{uuid.uuid4().hex[:8]}"
    body = b"x" * args.size
    async with tank_client(args.tank) as producer:
        await ensure_topic(producer, topic)
        await producer.produce({(topic, 0): [Message(body)]})
        next_seq = 2
        rounds = _Rounds(args.clients)
        async with trio.open_nursery() as nursery:
            for _ in range(args.clients):
                if args.protocol == "kafka":
                    nursery.start_soon(_kafka_client, args.kafka, topic, next_seq - 1,
                                       rounds, args.max_wait_ms)
                else:
                    nursery.start_soon(_tank_client, args.tank, topic, next_seq, rounds,
                                       args.max_wait_ms)
            await trio.sleep(0.5)  # every client connected and parked
            cpu0 = wall0 = 0.0
            delivered0 = 0
            for i in range(args.warmup + args.rounds):
                if i == args.warmup:
                    cpu0 = process_cpu_seconds(args.pid) or 0.0
                    wall0 = time.monotonic()
                    delivered0 = rounds.delivered
                rounds.reset()
                await producer.produce({(topic, 0): [Message(body)]})
                with trio.fail_after(30):
                    await rounds.event.wait()
                await trio.sleep(args.settle / 1000)
            cpu1 = process_cpu_seconds(args.pid) or 0.0
            wall1 = time.monotonic()
            nursery.cancel_scope.cancel()
    delivered = rounds.delivered - delivered0
    expected = args.rounds * args.clients
    if delivered != expected:
        raise SystemExit(f"delivered {delivered} messages, expected {expected}")
    cpu = cpu1 - cpu0
    return {"protocol": args.protocol, "clients": args.clients, "rounds": args.rounds,
            "delivered": delivered, "server_cpu_s": round(cpu, 3),
            "us_per_message": round(cpu / delivered * 1e6, 2),
            "us_per_append": round(cpu / args.rounds * 1e6, 1),
            "wall_s": round(wall1 - wall0, 3)}


def main(argv: list[str] | None = None) -> int:
    """Run once and print the figures (``--json`` for programs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pid", type=int, required=True, help="the server's process id")
    parser.add_argument("--tank", default="127.0.0.1:11011",
                        help="Tank listener (the producer, and the Tank clients)")
    parser.add_argument("--kafka", default="127.0.0.1:9092", help="Kafka listener")
    parser.add_argument("--protocol", choices=("tank", "kafka"), default="tank")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=500, help="timed appends")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--size", type=int, default=100, help="message bytes")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="ms to wait after every client has polled again")
    parser.add_argument("--max-wait-ms", type=int, default=30_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = trio.run(run, args)
    print(json.dumps(result) if args.json else
          " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
