"""``loopback``: raw TCP throughput between two processes on this machine.

The ceiling every other figure is compared with: a sender writes large buffers as fast as
the kernel takes them, a receiver process reads them into one buffer and throws them away.
Run as ``python -m gateway.bench.loopback --receive`` it is that receiver.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from typing import Final

import trio

from gateway.bench.payload import Payloads
from gateway.bench.procs import Share, WorkerResult, cpu_seconds
from gateway.bench.report import Check, Report, Row
from gateway.bench.scenario import Params, Scenario, make_report, total, wall

_MIB: Final = 1024 * 1024


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of sending")
    parser.add_argument("--write-size", type=int, default=_MIB, help="bytes per write")


def _params(args: argparse.Namespace) -> Params:
    if args.write_size < 1 or args.duration <= 0:
        raise ValueError("--write-size and --duration must be positive")
    return {"duration": args.duration, "write_size": args.write_size}


def _send(sock: socket.socket, data: bytes, duration: float) -> tuple[int, int]:
    """Write ``data`` again and again for ``duration`` seconds; (writes, bytes)."""
    view = memoryview(data)
    writes = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        sock.sendall(view)
        writes += 1
    sock.shutdown(socket.SHUT_WR)
    return writes, writes * len(data)


async def _work(params: Params, share: Share) -> WorkerResult:
    receiver = subprocess.Popen([sys.executable, "-m", "gateway.bench.loopback", "--receive",
                                 str(params["write_size"])],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        data = Payloads(params["seed"] + share.index, params["write_size"]).body(0)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            await share.start()
            writes, sent = await trio.to_thread.run_sync(_send, sock, data,
                                                         params["duration"])
            line = await trio.to_thread.run_sync(receiver.stdout.readline)
        got = json.loads(line)
    finally:
        if receiver.poll() is None:
            receiver.kill()
        receiver.wait()
    result = share.finish({"writes": writes, "sent": sent, "received": got["bytes"]},
                          end=got["end"], receiver_cpu=got["cpu"])
    result.cpu += got["cpu"]  # both ends are the generator here
    return result


async def _finish(params: Params, results: list[WorkerResult]) -> Report:
    received = total(results, "received")
    seconds = wall(results)
    row = Row("tcp loopback", total(results, "writes"), seconds, received,
              note=f"{params['write_size']:,}-byte writes; msgs/s = writes/s; "
                   f"{received * 8 / seconds / 1e9:.2f} Gbit/s")
    check = Check("bytes received", total(results, "sent"), received, unit="bytes")
    return make_report("loopback", params, results, [row], [check],
                       ["the ceiling: what two processes move over 127.0.0.1 with no "
                        "protocol at all"])


def receive(read_size: int) -> None:
    """The receiving process: print the port, read one connection to its end, then print
    ``{"bytes", "end", "cpu"}`` (``end`` is ``time.monotonic()`` at the last byte)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
    buffer = memoryview(bytearray(max(read_size, 64 * 1024)))
    received = 0
    with conn:
        while n := conn.recv_into(buffer):
            received += n
    print(json.dumps({"bytes": received, "end": time.monotonic(), "cpu": cpu_seconds()}),
          flush=True)


SCENARIO = Scenario("loopback", "raw TCP throughput between two processes on this "
                    "machine, the ceiling for every other figure", _add_arguments, _params,
                    _work, _finish)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--receive":
        receive(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m gateway.bench.loopback --receive READ_SIZE")
