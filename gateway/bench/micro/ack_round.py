"""The Figg acknowledgement round: one PUBLISH in flight, the time until its ACK.

Run from the repository root against a running Figg endpoint::

    .venv/bin/python -m gateway.bench.micro.ack_round --figg 127.0.0.1:8119 \\
        [--metrics 127.0.0.1:9464] [--pid PID] [--count 3000] [--size 128]

A raw socket sends a PUBLISH and waits for its ACK, ``--count`` times after a warm-up, and
prints the round's median, mean and deciles: a window-bound publisher (the Go client keeps
256 unacknowledged) gets at most its window per round. With ``--metrics`` (the server's
metrics listener) it also prints the mean group fsync of the same rounds
(``figtank_fsync_seconds``): in ``fsync`` durability the round less that is the hand-off
from the fsync back to the connection (the metrics listener renders at most once a
second: give it runs longer than that). With ``--pid`` (a server on this machine) it
prints the CPU the server's event-loop thread (its main thread) and the whole process
spent per round (utime + stime from ``/proc``).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import time
import urllib.request

from protocols.figg.messages import HEADER, VERSION, MessageType

WARM_UP = 200


def publish_frame(topic: bytes, seq: int, data: bytes) -> bytes:
    """A PUBLISH frame: ``topic | u64 seqNum | data``, variable fields ``u32 len | bytes``."""
    payload = b"".join([struct.pack(">I", len(topic)), topic, struct.pack(">QI", seq, len(data)),
                        data])
    return HEADER.pack(MessageType.PUBLISH, VERSION, len(payload)) + payload


def fsync_totals(metrics: str | None) -> tuple[float, float]:
    """(seconds, rounds) of ``figtank_fsync_seconds`` so far; zeros without ``metrics``."""
    if metrics is None:
        return 0.0, 0.0
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("figtank_fsync_seconds_sum", "figtank_fsync_seconds_count"):
            values[name] = float(value)
    return (values.get("figtank_fsync_seconds_sum", 0.0),
            values.get("figtank_fsync_seconds_count", 0.0))


def cpu_seconds(pid: int | None) -> tuple[float, float]:
    """(event-loop thread, whole process) CPU seconds of ``pid`` so far; zeros without."""
    if pid is None:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")

    def used(path: str) -> float:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    return used(f"/proc/{pid}/task/{pid}/stat"), used(f"/proc/{pid}/stat")


def rounds(sock: socket.socket, topic: bytes, data: bytes, first: int, count: int
           ) -> list[float]:
    """Seconds from sending each PUBLISH to receiving its ACK."""
    ack = struct.Struct(">HHIQ")
    out = []
    for seq in range(first, first + count):
        frame = publish_frame(topic, seq, data)
        started = time.perf_counter()
        sock.sendall(frame)
        reply = b""
        while len(reply) < ack.size:
            more = sock.recv(ack.size - len(reply))
            if not more:
                raise ConnectionError("the server closed the connection")
            reply += more
        out.append(time.perf_counter() - started)
        if ack.unpack(reply) != (MessageType.ACK, VERSION, 8, seq):
            raise ValueError(f"expected the ACK of {seq}, got {reply.hex()}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figg", default="127.0.0.1:8119", help="Figg endpoint HOST:PORT")
    parser.add_argument("--metrics", default=None, help="the server's metrics HOST:PORT")
    parser.add_argument("--pid", type=int, default=None,
                        help="the server's process id (on this machine): CPU per round")
    parser.add_argument("--count", type=int, default=3000, help="rounds measured")
    parser.add_argument("--size", type=int, default=128, help="bytes of each message")
    args = parser.parse_args()
    host, _, port = args.figg.rpartition(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        topic = b"ack-round-%d" % time.time_ns()
        data = b"x" * args.size
        rounds(sock, topic, data, 1, WARM_UP)
        before = fsync_totals(args.metrics)
        cpu_before = cpu_seconds(args.pid)
        took = rounds(sock, topic, data, WARM_UP + 1, args.count)
        cpu_after = cpu_seconds(args.pid)
        after = fsync_totals(args.metrics)
    deciles = statistics.quantiles(took, n=10)
    line = (f"ACK round over {len(took)} publishes: median {statistics.median(took) * 1e6:.1f} µs"
            f", mean {statistics.mean(took) * 1e6:.1f}, p10 {deciles[0] * 1e6:.1f}"
            f", p90 {deciles[-1] * 1e6:.1f}")
    syncs = after[1] - before[1]
    if syncs:
        line += (f"; {syncs:.0f} fsync rounds, mean fsync "
                 f"{(after[0] - before[0]) / syncs * 1e6:.1f} µs")
    if args.pid is not None:
        loop, process = (b - a for a, b in zip(cpu_before, cpu_after, strict=True))
        line += (f"; server CPU per round: event loop {loop / len(took) * 1e6:.0f} µs, "
                 f"process {process / len(took) * 1e6:.0f} µs")
    print(line)


if __name__ == "__main__":
    main()
