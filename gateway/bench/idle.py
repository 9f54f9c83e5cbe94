"""``idle-connections``: the server's resident memory per idle connection, per protocol.

A ``figtank serve`` child process is started with its Figg, Tank and Kafka listeners on
loopback. For each protocol in turn, ``count`` connections are opened (plain blocking
sockets, in groups of :data:`GROUP`); each does one small exchange and then stays open
and silent:

- Figg: a PING, answered by a PONG;
- Tank: the broker's greeting (its Ping) is read, then a Consume at the tail of a topic
  with a 10 ms wait: a long poll that starts a task on the server and ends empty;
- Kafka: an ApiVersions (version 0).

The server's VmRSS (``/proc/PID/status``) is read before the connections open and once
they have all been answered (after it stops moving); the difference over ``count`` is
the resident memory one idle connection costs. Each protocol is measured in a server of its
own (a fresh process), so that memory one protocol's connections freed is not reused by
the next's. Kernel socket buffers are not in the process's RSS.
"""

from __future__ import annotations

import argparse
import resource
import socket
import struct
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gateway.bench.procs import Share, WorkerResult
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report
from gateway.bench.serving import serve_figtank
from protocols.connection import Role
from protocols.figg.messages import FAST, MessageType
from protocols.tank.connection import TankConnection
from protocols.tank.messages import (
    ConsumePartition,
    ConsumeRequest,
    ConsumeTopic,
    CreateTopicRequest,
)
from protocols.wire import UINT64_MAX

PROTOCOLS: Final = ("figg", "tank", "kafka")
#: Connections opened, then answered, together.
GROUP: Final = 500
#: The topic the Tank connections long-poll at the tail of.
TOPIC: Final = "idle"
#: The server's idle timeout while measuring: on, as by default, but longer than a run.
IDLE_TIMEOUT: Final = 600.0
#: Descriptors the measuring process needs beside its connections.
SPARE_FILES: Final = 64

_FIGG_HEAD: Final = struct.Struct(">HHI")
_TANK_HEAD: Final = struct.Struct("<BI")
_KAFKA_HEAD: Final = struct.Struct(">I")


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def settled_rss(pid: int, *, timeout: float = 10.0) -> int:
    """``pid``'s RSS once two readings 0.2 s apart agree within 64 KiB."""
    last = rss_bytes(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = rss_bytes(pid)
        if abs(now - last) < 64 * 1024:
            return now
        last = now
    return last


def ensure_descriptors(count: int) -> None:
    """Raise this process's soft descriptor limit for ``count`` sockets (up to the hard
    limit); ValueError when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + SPARE_FILES
    if soft >= want:
        return
    if hard != resource.RLIM_INFINITY and hard < want:
        raise ValueError(f"{count} connections need {want} descriptors; the hard limit is "
                         f"{hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# ------------------------------------------------------------------- the exchanges


@dataclass(frozen=True)
class Exchange:
    """What one connection sends, and how many reply frames it waits for."""

    request: bytes
    replies: int
    #: ``(header struct, field index of the payload length)`` of the replies' frames.
    head: struct.Struct
    length_index: int


def _figg() -> Exchange:
    return Exchange(FAST[MessageType.PING].encode_frame(1), 1, _FIGG_HEAD, 2)


def _tank() -> Exchange:
    consume = ConsumeRequest(client_version=2, request_id=1, client_id="idle",
                             max_wait_ms=10, min_bytes=0, topics=[ConsumeTopic(
                                 TOPIC, [ConsumePartition(0, UINT64_MAX, 4096)])])
    # The greeting Ping, then the empty Consume response.
    return Exchange(TankConnection(Role.CLIENT).send(consume), 2, _TANK_HEAD, 1)


def _kafka() -> Exchange:
    client_id = b"idle"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id  # ApiVersions v0
    return Exchange(_KAFKA_HEAD.pack(len(body)) + body, 1, _KAFKA_HEAD, 0)


EXCHANGES: Final[dict[str, Callable[[], Exchange]]] = {
    "figg": _figg, "tank": _tank, "kafka": _kafka}


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            raise ConnectionError("the server closed an idle connection")
        data += piece
    return bytes(data)


def _read_replies(sock: socket.socket, exchange: Exchange) -> None:
    for _ in range(exchange.replies):
        fields = exchange.head.unpack(_read_exactly(sock, exchange.head.size))
        _read_exactly(sock, fields[exchange.length_index])


def open_idle(address: tuple[str, int], exchange: Exchange, count: int,
              *, timeout: float = 30.0) -> list[socket.socket]:
    """``count`` connections to ``address`` that each made ``exchange`` and are idle now."""
    opened: list[socket.socket] = []
    try:
        while len(opened) < count:
            group = [socket.create_connection(address, timeout=timeout)
                     for _ in range(min(GROUP, count - len(opened)))]
            opened += group
            for sock in group:
                sock.sendall(exchange.request)
            for sock in group:
                _read_replies(sock, exchange)
    except BaseException:
        close_all(opened)
        raise
    return opened


def close_all(sockets: Sequence[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def create_topic(address: tuple[str, int]) -> None:
    """Create :data:`TOPIC` (one partition) over a Tank connection."""
    conn = TankConnection(Role.CLIENT)
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(conn.send(CreateTopicRequest(request_id=1, topic=TOPIC, partitions=1)))
        _read_replies(sock, Exchange(b"", 2, _TANK_HEAD, 1))  # the greeting, the answer


@dataclass(frozen=True)
class Measurement:
    """The server's RSS before and with ``count`` idle connections of ``protocol``."""

    protocol: str
    count: int
    before: int
    after: int
    seconds: float

    @property
    def per_connection(self) -> float:
        """Bytes of resident memory per idle connection."""
        return (self.after - self.before) / self.count


def measure(pid: int, protocol: str, address: tuple[str, int], count: int) -> Measurement:
    """Open ``count`` idle connections of ``protocol`` to the server ``pid`` at
    ``address``, read its RSS, close them again."""
    before = settled_rss(pid)
    start = time.monotonic()
    sockets = open_idle(address, EXCHANGES[protocol](), count)
    try:
        seconds = time.monotonic() - start
        after = settled_rss(pid)
    finally:
        close_all(sockets)
    return Measurement(protocol, count, before, after, seconds)


def measure_server(count: int, protocols: Sequence[str] = PROTOCOLS) -> list[Measurement]:
    """For each protocol, start a fresh ``figtank serve`` (memory freed by one protocol's
    connections would otherwise be reused by the next's) with room for ``count``
    connections per listener and an idle timeout (on, as by default, but longer than the
    measurement), and measure its idle connections."""
    ensure_descriptors(count)
    with tempfile.TemporaryDirectory(prefix="figtank-idle-") as scratch:
        config = Path(scratch) / "figtank.toml"
        config.write_text(f"[limits]\nidle_timeout_secs = {IDLE_TIMEOUT:g}\n"
                          f"max_connections = {max(count, 10_000)}\n")
        return [_measure_one(protocol, count, config) for protocol in protocols]


def _measure_one(protocol: str, count: int, config: Path) -> Measurement:
    with serve_figtank("--config", str(config), "--kafka-listen", "127.0.0.1:0",
                       durability="os") as served:
        addresses = {"figg": served.figg, "tank": served.tank, "kafka": served.kafka}
        if protocol == "tank":
            create_topic(_split(served.tank))
        return measure(served.process.pid, protocol, _split(addresses[protocol]), count)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ------------------------------------------------------------------- the scenario


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connections", type=int, default=10_000,
                        help="idle connections per protocol (default 10,000)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS),
                        help="which listeners, comma-separated (default figg,tank,kafka)")
    parser.add_argument("--ceiling", type=int, default=10_000,
                        help="bytes per connection the check allows (default 10,000)")


def _params(args: argparse.Namespace) -> Params:
    protocols = [p for p in args.protocols.split(",") if p]
    unknown = sorted(set(protocols) - set(PROTOCOLS))
    if unknown or not protocols:
        raise ValueError(f"--protocols: choose among {', '.join(PROTOCOLS)}")
    if args.connections < 1 or args.ceiling < 1:
        raise ValueError("--connections and --ceiling must be positive")
    return {"connections": args.connections, "protocols": protocols,
            "ceiling": args.ceiling}


async def _work(params: Params, share: Share) -> WorkerResult:
    import trio

    await share.start()
    results = await trio.to_thread.run_sync(
        measure_server, params["connections"], params["protocols"])
    counts = {}
    for result in results:
        counts[f"{result.protocol}_bytes"] = result.after - result.before
        counts[f"{result.protocol}_seconds_us"] = int(result.seconds * 1e6)
        counts[f"{result.protocol}_rss_before"] = result.before
    return share.finish(counts)


async def _finish(params: Params, results: list[WorkerResult]) -> Report:
    count = params["connections"]
    counts = results[0].counts
    rows, checks = [], []
    for protocol in params["protocols"]:
        grown = counts[f"{protocol}_bytes"]
        per = grown / count
        rows.append(Row(f"{protocol} idle connections", count,
                        counts[f"{protocol}_seconds_us"] / 1e6, grown,
                        note=f"{per:,.0f} bytes per connection (RSS "
                             f"{counts[f'{protocol}_rss_before'] / 2**20:.1f} MiB before)"))
        over = per > params["ceiling"]
        checks.append(Check(f"{protocol}: idle connections held", count, count,
                            unit="connections", problem=(
                                f"{per:,.0f} bytes per connection, over the ceiling of "
                                f"{params['ceiling']:,}" if over else "")))
    return make_report("idle-connections", params, results, rows, checks, [
        "server RSS growth with the connections open and idle, over their count; "
        "msgs/s = connections opened per second (each with its exchange); "
        "kernel socket buffers are not in the RSS"])


SCENARIO = Scenario("idle-connections", "resident memory of the server per idle Figg, "
                    "Tank and Kafka connection (starts its own figtank serve)",
                    _add_arguments, _params, _work, _finish)
