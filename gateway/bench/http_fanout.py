"""``http-fanout``: one publisher, N Server-Sent Events and N WebSocket subscribers of the
HTTP listener, on loopback.

Each worker process connects its subscribers with plain sockets and reads them all in one
epoll loop (many sockets per wake-up, each read only counted: SSE ids, WebSocket data
frames), so that the generator costs little per delivery next to the server.

The subscribers connect and attach first (SSE streams of partition 0 from its end,
WebSockets attached from its end); once all are in, the server's resident memory is read
again (``--server-pid``): the growth divided by the subscribers is the memory of an idle
subscriber. Then the publisher POSTs ``--rate`` messages a second for ``--duration``
seconds as NDJSON batches (one every 10 ms; from a process of its own), each
value the time it was sent; every
subscriber counts what it gets, and one in ``--sample-every`` also measures each message's
publish-to-delivery latency. It stops once every subscriber has every message (or
``--drain`` seconds after the last publish), and checks each got each message once.
"""

from __future__ import annotations

import argparse
import re
import resource
import select
import socket
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from typing import Final

import h11
import trio
from wsproto.frame_protocol import FrameProtocol

from gateway.bench.endpoints import unique_topic
from gateway.bench.procs import Share, WorkerResult
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report, samples, total
from gateway.bench.stats import summarize
from gateway.core.config import parse_address

TICK: Final = 0.01
#: Subscribers whose requests are in flight together while connecting.
CONNECT_BATCH: Final = 200
CONNECT_TIMEOUT: Final = 30.0
#: Connections the publisher spreads its requests over.
PUBLISHERS: Final = 8
#: Bytes read from a socket at once.
READ_SIZE: Final = 256 * 1024
_VALUE = re.compile(rb'"value":"(\d+)')
_SSE_EVENT = b"\nid: "
_WS_EVENT = b'{"op":"data"'


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http", default="127.0.0.1:8080", help="HTTP listener HOST:PORT")
    parser.add_argument("--subscribers", type=int, default=100,
                        help="SSE subscribers, and as many WebSocket ones")
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of publishing")
    parser.add_argument("--size", type=int, default=64, help="bytes per message value")
    parser.add_argument("--sample-every", type=int, default=50,
                        help="one subscriber in this many measures latency")
    parser.add_argument("--drain", type=float, default=30.0,
                        help="seconds after the last publish the subscribers get")


def _params(args: argparse.Namespace) -> Params:
    if args.subscribers < 1 or args.rate <= 0 or args.duration <= 0 or args.size < 20:
        raise ValueError("--subscribers, --rate, --duration must be positive, --size >= 20")
    parse_address(args.http)
    # One batch every TICK seconds, or one message every 1/rate seconds when slower.
    tick = max(TICK, 1 / args.rate)
    per_tick = max(1, round(args.rate * tick))
    ticks = max(1, round(args.duration / tick))
    return {"http": args.http, "subscribers": args.subscribers, "rate": per_tick / tick,
            "duration": ticks * tick, "size": args.size, "sample_every": args.sample_every,
            "drain": args.drain, "messages": per_tick * ticks, "_per_tick": per_tick,
            "_tick": tick}


def _rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _request(method: str, target: str, headers: list[tuple[str, str]], body: bytes = b""
             ) -> bytes:
    conn = h11.Connection(h11.CLIENT)
    out = conn.send(h11.Request(method=method, target=target,
                                headers=[("host", "localhost"), *headers]))
    if body:
        out += conn.send(h11.Data(data=body))
    return out + (conn.send(h11.EndOfMessage()) or b"") if method == "POST" else out


class _Subscriber:
    """One subscriber: its socket, what it got, and (one in ``--sample-every``) the
    publish-to-delivery latency of each message."""

    __slots__ = ("carry", "got", "latencies", "marker", "sock")

    def __init__(self, sock: socket.socket, marker: bytes, sampled: bool) -> None:
        self.sock = sock
        self.marker = marker
        self.carry = b""
        self.got = 0
        self.latencies: list[float] | None = [] if sampled else None

    def take(self, data: bytes) -> None:
        """Count the events that end in ``data`` (read now)."""
        window = self.carry + data if self.carry else data
        self.got += window.count(self.marker)
        if self.latencies is not None:
            now = time.time_ns()
            self.latencies += [(now - int(t)) / 1e9 for t in _VALUE.findall(window)]
        self.carry = window[1 - len(self.marker):]


def _read_head(sock: socket.socket) -> bytes:
    """Read a response head; what came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("the server closed the connection")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    if head.split(b" ", 2)[1] not in (b"200", b"101"):
        status_line = head.split(b"\r\n", 1)[0]
        raise ConnectionError(f"the server answered {status_line!r}")
    return rest


_WS_UPGRADE = [("upgrade", "websocket"), ("connection", "Upgrade"),
               ("sec-websocket-version", "13"),
               ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")]


def _connect(host: str, port: int, topic: str, kinds: list[str], every: int
             ) -> list[_Subscriber]:
    """Open a subscriber of each kind (``sse``, ``ws``) in ``kinds``, :data:`CONNECT_BATCH`
    at a time (each batch's requests in flight together); sockets left non-blocking."""
    attach = FrameProtocol(client=True, extensions=[]).send_data(
        f'{{"op":"attach","topic":"{topic}","from":"latest"}}', fin=True)
    subs: list[_Subscriber] = []
    for first in range(0, len(kinds), CONNECT_BATCH):
        batch = []
        for kind in kinds[first:first + CONNECT_BATCH]:
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
            sock.sendall(_request("GET", f"/topics/{topic}/events?partition=0", [])
                         if kind == "sse" else _request("GET", "/ws", _WS_UPGRADE))
            batch.append((kind, sock))
        for kind, sock in batch:
            rest = _read_head(sock)
            if kind == "ws":
                sock.sendall(attach)
                while b'"attached"' not in rest:
                    rest += sock.recv(65536)
                rest = rest.split(b'"attached"', 1)[1]
            sub = _Subscriber(sock, _SSE_EVENT if kind == "sse" else _WS_EVENT,
                              len(subs) // 2 % every == 0)
            sub.take(rest)
            sock.setblocking(False)
            subs.append(sub)
    return subs


def _read_all(subs: list[_Subscriber], want: int, until: float) -> None:
    """Read every subscriber's socket (one epoll, many sockets per wake-up) until each
    has ``want`` events, its server closed it, or ``time.monotonic()`` passes ``until``."""
    poll = select.epoll()
    by_fd = {}
    # One buffer for every read (a fresh 256 KiB object per read costs more than the
    # read: the allocator maps and unmaps it).
    buffer = bytearray(READ_SIZE)
    view = memoryview(buffer)
    try:
        for sub in subs:
            if sub.got < want:
                fd = sub.sock.fileno()
                by_fd[fd] = sub
                poll.register(fd, select.EPOLLIN)
        while by_fd and time.monotonic() < until:
            for fd, _ in poll.poll(0.1, 4096):
                sub = by_fd[fd]
                try:
                    size = sub.sock.recv_into(buffer)
                except BlockingIOError:
                    continue
                except OSError:
                    size = 0
                if size:
                    sub.take(view[:size].tobytes())
                if not size or sub.got >= want:
                    poll.unregister(fd)
                    del by_fd[fd]
    finally:
        poll.close()


async def _publish(host: str, port: int, topic: str, params: Params) -> int:
    """POST one NDJSON batch every tick, on time, over :data:`PUBLISHERS` connections
    in turn (as many publishers would: a server answers each connection's requests one
    after the other); each connection's answers are counted as they come."""
    streams = [await trio.open_tcp_stream(host, port) for _ in range(PUBLISHERS)]
    pad = "x" * max(0, params["size"] - 19)
    ticks = round(params["duration"] / params["_tick"])
    head = (f"POST /topics/{topic} HTTP/1.1\r\nhost: localhost\r\n"
            "content-type: application/x-ndjson\r\ncontent-length: %d\r\n\r\n")
    try:
        async with trio.open_nursery() as nursery:
            for i, stream in enumerate(streams):
                nursery.start_soon(_answers, stream, len(range(i, ticks, PUBLISHERS)),
                                   params["duration"] + params["drain"])
            start = trio.current_time()
            for tick in range(ticks):
                await trio.sleep_until(start + tick * params["_tick"])
                now = time.time_ns()
                body = "".join(f'{{"value":"{now}{pad}"}}\n'
                               for _ in range(params["_per_tick"])).encode()
                await streams[tick % PUBLISHERS].send_all((head % len(body)).encode() + body)
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)
    sent: int = ticks * params["_per_tick"]
    return sent


async def _answers(stream: trio.SocketStream, count: int, within: float) -> None:
    """Wait for ``count`` answers, each a 200, for up to ``within`` seconds."""
    seen = 0
    pending = b""
    with trio.fail_after(within):
        while seen < count:
            data = await stream.receive_some(65536)
            if not data:
                raise ConnectionError("the server closed the publisher's connection")
            pending += data
            while True:
                at = pending.find(b"HTTP/1.1 ")
                if at < 0 or len(pending) < at + 12:
                    pending = pending[at:] if at >= 0 else pending[-8:]
                    break
                if pending[at + 9:at + 12] != b"200":
                    raise ConnectionError(f"a publish was refused: {pending[at:at + 200]!r}")
                seen += 1
                pending = pending[at + 12:]


def _ready() -> bool:
    """Nothing: run once, the publisher's process has imported this module."""
    return True


def _publish_in_process(host: str, port: int, topic: str, params: Params) -> int:
    return trio.run(_publish, host, port, topic, params)


def _create_topic(host: str, port: int, topic: str) -> None:
    with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT) as sock:
        sock.sendall(_request("POST", f"/topics/{topic}", [("content-length", "0")]))
        _read_head(sock)  # the topic exists (an empty first message)


async def _prepare(params: Params) -> Params:
    topic = params["topic"] or unique_topic("http-fanout")
    host, port = parse_address(params["http"])
    await trio.to_thread.run_sync(_create_topic, host, port, topic)
    return {**params, "topic": topic}


async def _work(params: Params, share: Share) -> WorkerResult:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = parse_address(params["http"])
    topic, want = params["topic"], params["messages"]
    _, count = share.part(params["subscribers"])
    rss_before = _rss(params.get("server_pid"))
    # Connected and read in threads of their own, with plain sockets: the reading of
    # thousands of sockets is the generator's cost per delivery, kept to one epoll loop.
    # (Bounded: every socket operation times out after CONNECT_TIMEOUT.)
    subs = await trio.to_thread.run_sync(_connect, host, port, topic, ["sse", "ws"] * count,
                                         params["sample_every"])
    sent = 0
    # The publisher runs in a process of its own (a reading thread holding the GIL would
    # delay each publish by the interpreter's switch interval), started before the clock.
    pool = ProcessPoolExecutor(1, mp_context=get_context("spawn")) if share.index == 0 else None
    try:
        if pool is not None:
            await trio.to_thread.run_sync(pool.submit(_ready).result)
        await trio.sleep(1.0)
        rss_idle = _rss(params.get("server_pid"))
        await share.start()
        first = time.monotonic()
        until = first + params["duration"] + params["drain"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.to_thread.run_sync, _read_all, subs, want, until))
            if pool is not None:
                publishing = pool.submit(_publish_in_process, host, port, topic, params)
                sent = await trio.to_thread.run_sync(publishing.result)
        last = time.monotonic()
    finally:
        if pool is not None:
            pool.shutdown()
        for sub in subs:
            sub.sock.close()
    sse, ws = subs[0::2], subs[1::2]
    return share.finish(
        {"sent": sent, "sse": sum(s.got for s in sse), "ws": sum(s.got for s in ws),
         "sse_subs": len(sse), "ws_subs": len(ws),
         "exact": sum(1 for s in subs if s.got == want)},
        {"sse": [x for s in sse if s.latencies for x in s.latencies],
         "ws": [x for s in ws if s.latencies for x in s.latencies]},
        end=last, rss_before=rss_before, rss_idle=rss_idle, first=first)


async def _finish(params: Params, results: list[WorkerResult]) -> Report:
    start = min(r.info["first"] for r in results)
    seconds = max(r.end for r in results) - start
    want = params["messages"]
    subscribers = total(results, "sse_subs") + total(results, "ws_subs")
    rows = []
    for kind in ("sse", "ws"):
        delivered = total(results, kind)
        rows.append(Row(f"{kind} deliveries", delivered, seconds,
                        delivered * params["size"], summarize(samples(results, kind)),
                        "publish-to-delivery", delivered / total(results, f"{kind}_subs")
                        / seconds))
    all_delivered = total(results, "sse") + total(results, "ws")
    rows.append(Row("all deliveries", all_delivered, seconds, all_delivered * params["size"],
                    summarize(samples(results, "sse") + samples(results, "ws")),
                    "publish-to-delivery"))
    checks = [Check("deliveries (messages x subscribers)", want * subscribers,
                    all_delivered),
              Check("subscribers with every message once", subscribers,
                    total(results, "exact"), unit="subscribers")]
    notes = [f"{subscribers} subscribers ({params['subscribers']} SSE, as many WebSocket); "
             f"{want} messages at {params['rate']:g}/s"]
    before = [r.info["rss_before"] for r in results if r.info.get("rss_before")]
    idle = [r.info["rss_idle"] for r in results if r.info.get("rss_idle")]
    if before and idle:
        per = (max(idle) - min(before)) / subscribers
        notes.append(f"server memory per idle subscriber: {per / 1024:.1f} KiB "
                     f"(RSS {min(before) / 2**20:.1f} MiB -> {max(idle) / 2**20:.1f} MiB)")
    else:
        notes.append("server memory per idle subscriber: give --server-pid to measure it")
    return make_report("http-fanout", params, results, rows, checks, notes)


SCENARIO = Scenario("http-fanout", "one publisher and N SSE plus N WebSocket subscribers "
                    "of the HTTP listener: deliveries/s, publish-to-delivery latency, memory "
                    "per idle subscriber", _add_arguments, _params, _work, _finish, _prepare)
