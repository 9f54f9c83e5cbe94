"""The soak's well-behaved client, run as a process of its own so that the abusers' work
in the soak's process never shows in its latency:
``python -m gateway.bench.soak.good --figg HOST:PORT --tank HOST:PORT``.

It prints one JSON line when it is ready, works until a line (or the end) arrives on its
stdin, then stops sending, waits for the last acknowledgements, reads its topics back
and prints one JSON line with its figures. What it does meanwhile, each in a task:

- **Figg publisher**: PUBLISH at ``--rate`` per second to its own topic with figtank's
  Figg client (which resends what is unacknowledged after a reconnect); publish->ACK
  latency, counted from when each publish was due, so a stalled server counts in full.
- **Figg pinger**: PING/PONG round trips on a raw connection of its own.
- **Tank producer**: one message per Produce at ``--tank-rate`` to a second topic;
  request latency.
- **Tank follower**: long-polls the Figg topic over Tank; publish->delivery latency.

Every message carries ``u64 id | u64 due time (ns)``. A message counts as acknowledged
when its ACK (Figg) or its produce response with code 0 (Tank) arrived; the read-back
reports every acknowledged id that is not in the topic as lost.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from gateway.bench.endpoints import unique_topic
from gateway.bench.soak.wire import close, connect, loopback_address
from gateway.bench.stats import summarize
from gateway.client.errors import ClientError
from gateway.client.figg import FiggClient, open_figg_client
from gateway.client.tank import FIRST_AVAILABLE, TankClient, open_tank_client
from gateway.core.logs import configure_logging
from protocols.connection import CLOSED, Role
from protocols.errors import ProtocolError
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import FAST, MessageType, Pong

STAMP: Final = struct.Struct(">QQ")
#: A request that takes longer than this counts as one sample of this long, and the
#: connection is given up.
REQUEST_TIMEOUT: Final = 10.0
#: Behind schedule by more than this, a sender skips the slots it missed instead of
#: sending them in a burst.
MAX_LAG: Final = 1.0
#: Latency samples kept per measure (enough for 60 s at the default rates many times over).
MAX_SAMPLES: Final = 500_000

_encode_ping = FAST[MessageType.PING].encode_frame


@dataclass
class Measure:
    """Latencies (seconds) of one kind of exchange and what went wrong."""

    samples: list[float] = field(default_factory=list)
    errors: int = 0
    reconnects: int = 0

    def add(self, seconds: float) -> None:
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(seconds)

    def summary(self) -> dict[str, Any]:
        stats = summarize(self.samples) or {}
        return {"count": len(self.samples), "errors": self.errors,
                "reconnects": self.reconnects,
                **{k: round(stats[k] * 1000, 3) for k in ("p50", "p99", "p999", "max")
                   if k in stats}}


@dataclass
class Ledger:
    """Which message ids were sent and acknowledged on one topic."""

    topic: str
    sent: int = 0
    skipped: int = 0
    acked: set[int] = field(default_factory=set)


def payload(ident: int, due_ns: int, size: int) -> bytes:
    return STAMP.pack(ident, due_ns).ljust(size, b".")


async def paced(rate: float, send: Callable[[int, int], Awaitable[None]],
                ledger: Ledger) -> None:
    """Call ``send(id, due_ns)`` ``rate`` times a second until cancelled; slots missed by
    more than :data:`MAX_LAG` are skipped (counted in ``ledger.skipped``)."""
    interval_ns = int(1e9 / rate)
    due = time.monotonic_ns()
    ident = 0
    while True:
        now = time.monotonic_ns()
        if now - due > MAX_LAG * 1e9:
            missed = (now - due) // interval_ns
            ledger.skipped += missed
            due += missed * interval_ns
        elif due > now:
            await trio.sleep((due - now) / 1e9)
        ident += 1
        ledger.sent += 1
        await send(ident, due)
        due += interval_ns


class Good:
    """The well-behaved client's state: its topics, ledgers and measures."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.figg = loopback_address(args.figg)
        self.tank = loopback_address(args.tank)
        self.figg_ledger = Ledger(unique_topic("soak-good-figg"))
        self.tank_ledger = Ledger(unique_topic("soak-good-tank"))
        self.publish = Measure()
        self.ping = Measure()
        self.produce = Measure()
        self.delivery = Measure()
        self.figg_client: FiggClient | None = None
        #: Due time (ns) of each Figg publish not acknowledged yet, by id.
        self.pending: dict[int, int] = {}
        #: Set when the run is over (the client's own disconnect is no reconnect).
        self.stopping = False

    async def create_topics(self) -> None:
        """Create both topics with message 0 before anything else runs (and before the
        abusers can fill the server's topic budget)."""
        assert self.figg_client is not None
        zero = payload(0, time.monotonic_ns(), self.args.size)
        await self.figg_client.publish_and_wait(self.figg_ledger.topic, zero)
        self.figg_ledger.acked.add(0)
        self.figg_ledger.sent = 1
        async with open_tank_client(*self.tank, client_id="soak-good") as client:
            await client.produce({(self.tank_ledger.topic, 0): [zero]})
        self.tank_ledger.acked.add(0)
        self.tank_ledger.sent = 1

    # ------------------------------------------------------------------ Figg publisher

    async def publish_one(self, ident: int, due_ns: int) -> None:
        client = self.figg_client
        assert client is not None
        ledger, measure, pending = self.figg_ledger, self.publish, self.pending

        def on_ack(_: int) -> None:
            ledger.acked.add(ident)
            pending.pop(ident, None)
            measure.add((time.monotonic_ns() - due_ns) / 1e9)

        pending[ident] = due_ns
        await client.publish(ledger.topic, payload(ident, due_ns, self.args.size), on_ack)

    def count_unacked(self) -> int:
        """Publishes never acknowledged: each counts as one latency sample as long as it
        has waited so far (a publisher stuck for good must show in the percentiles)."""
        now = time.monotonic_ns()
        for due_ns in self.pending.values():
            self.publish.add((now - due_ns) / 1e9)
        return len(self.pending)

    def on_figg_state(self, state: object) -> None:
        if getattr(state, "value", "") == "disconnected" and not self.stopping:
            self.publish.reconnects += 1

    # --------------------------------------------------------------------- Figg pinger

    async def pinger(self) -> None:
        """PING/PONG round trips, one at a time, every ``--ping-interval`` seconds."""
        while True:
            try:
                stream = await connect(self.figg)
            except OSError:
                self.ping.errors += 1
                await trio.sleep(0.1)
                continue
            try:
                await self._ping_on(stream)
            finally:
                await close(stream)
            self.ping.reconnects += 1

    async def _ping_on(self, stream: trio.SocketStream) -> None:
        conn = FiggConnection(Role.CLIENT)
        while True:
            start = time.monotonic()
            with trio.move_on_after(REQUEST_TIMEOUT) as scope:
                try:
                    await stream.send_all(_encode_ping(time.time_ns()))
                    if not await _await_pong(stream, conn):
                        self.ping.errors += 1
                        return
                except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError):
                    self.ping.errors += 1
                    return
            self.ping.add(time.monotonic() - start)
            if scope.cancelled_caught:
                self.ping.errors += 1
                return
            await trio.sleep(self.args.ping_interval)

    # ------------------------------------------------------------------- Tank producer

    async def tank_producer(self) -> None:
        ledger = self.tank_ledger
        while True:
            try:
                async with open_tank_client(*self.tank, client_id="soak-good",
                                            connect_timeout=REQUEST_TIMEOUT) as client:
                    async def produce(ident: int, due_ns: int) -> None:
                        await self._produce_one(client, ident, due_ns)
                    await paced(self.args.tank_rate, produce, ledger)
            except (ClientError, OSError):
                self.produce.reconnects += 1
                await trio.sleep(0.1)

    async def _produce_one(self, client: TankClient, ident: int, due_ns: int) -> None:
        ledger = self.tank_ledger
        body = payload(ident, due_ns, self.args.size)
        with trio.move_on_after(REQUEST_TIMEOUT) as scope:
            try:
                await client.produce({(ledger.topic, 0): [body]})
            except ClientError as exc:
                if not client.connected:
                    raise
                self.produce.errors += 1
                log_error("produce", exc)
                return
            ledger.acked.add(ident)
        self.produce.add((time.monotonic_ns() - due_ns) / 1e9)
        if scope.cancelled_caught:
            self.produce.errors += 1
            raise ClientError("produce timed out")

    # ------------------------------------------------------------------- Tank follower

    async def follower(self) -> None:
        """Follow the Figg topic over Tank: the delay from a publish being due to the
        message reaching a Tank consumer."""
        seq = FIRST_AVAILABLE
        while True:
            try:
                async with open_tank_client(*self.tank, client_id="soak-follow",
                                            connect_timeout=REQUEST_TIMEOUT) as client:
                    while True:
                        seq = await self._follow_once(client, seq)
            except (ClientError, OSError, trio.TooSlowError):
                self.delivery.reconnects += 1
                await trio.sleep(0.1)

    async def _follow_once(self, client: TankClient, seq: int) -> int:
        with trio.fail_after(REQUEST_TIMEOUT):
            result = await client.consume(self.figg_ledger.topic, 0, seq, max_wait_ms=500)
        now = time.monotonic_ns()
        for message in result.messages:
            if len(message.value) >= STAMP.size:
                self.delivery.add((now - STAMP.unpack_from(message.value)[1]) / 1e9)
        return result.next_seq

    # ---------------------------------------------------------------------- the end

    async def drain(self) -> bool:
        """Wait (bounded) for the Figg publishes still unacknowledged; whether all came."""
        client = self.figg_client
        if client is None:
            return True
        with trio.move_on_after(self.args.drain_timeout):
            await client.wait_all_acked()
            return True
        return False

    async def read_back(self) -> dict[str, Any]:
        """Read both topics back over Tank; ids acknowledged and not found are lost."""
        out: dict[str, Any] = {}
        for name, ledger in (("figg", self.figg_ledger), ("tank", self.tank_ledger)):
            seen = await read_ids(self.tank, ledger.topic, self.args.drain_timeout * 3)
            lost = None if seen is None else len(ledger.acked - seen)
            out[name] = {"topic": ledger.topic, "sent": ledger.sent, "skipped": ledger.skipped,
                         "acked": len(ledger.acked), "read_back": seen is not None,
                         "lost": lost}
        return out


async def _await_pong(stream: trio.SocketStream, conn: FiggConnection) -> bool:
    """Read until a PONG; False when the server closed the connection first."""
    while True:
        for event in conn.next_events():
            if event is CLOSED:
                return False
            if type(event) is Pong:
                return True
        data = await stream.receive_some(65536)
        conn.receive_data(data)
        if not data:
            return False


async def read_ids(address: tuple[str, int], topic: str, patience: float) -> set[int] | None:
    """Every message id in ``topic``/0, read from the first sequence over Tank; None when
    it could not be read within ``patience`` seconds (retried on failures)."""
    with trio.move_on_after(patience):
        while True:
            try:
                return await _read_ids_once(address, topic)
            except (ClientError, OSError, trio.TooSlowError) as exc:
                log_error("read_back", exc)
                await trio.sleep(0.5)
    return None


async def _read_ids_once(address: tuple[str, int], topic: str) -> set[int]:
    seen: set[int] = set()
    async with open_tank_client(*address, client_id="soak-check",
                                connect_timeout=REQUEST_TIMEOUT) as client:
        seq = FIRST_AVAILABLE
        while True:
            with trio.fail_after(REQUEST_TIMEOUT):
                result = await client.consume(topic, 0, seq)
            for message in result.messages:
                if len(message.value) >= STAMP.size:
                    seen.add(STAMP.unpack_from(message.value)[0])
            if not result.messages and result.next_seq > result.high_water_mark:
                return seen
            seq = result.next_seq


def log_error(what: str, exc: BaseException) -> None:
    print(f"soak-good: {what}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


async def wait_for_stop(limit: float) -> None:
    """Return when stdin has a line or ends, or after ``limit`` seconds."""
    with trio.move_on_after(limit):
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    good = Good(args)
    async with open_figg_client(*good.figg, window=args.window, max_refusals=None,
                                on_state_change=good.on_figg_state) as figg:
        good.figg_client = figg
        with trio.fail_after(REQUEST_TIMEOUT):
            await good.create_topics()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(paced, args.rate, good.publish_one, good.figg_ledger)
            nursery.start_soon(good.pinger)
            nursery.start_soon(good.tank_producer)
            nursery.start_soon(good.follower)
            print(json.dumps({"ready": True, "figg_topic": good.figg_ledger.topic,
                              "tank_topic": good.tank_ledger.topic}), flush=True)
            started = time.monotonic()
            await wait_for_stop(args.max_seconds)
            seconds = time.monotonic() - started
            nursery.cancel_scope.cancel()
        drained = await good.drain()
        unacked = good.count_unacked()
        good.stopping = True
    return {"seconds": round(seconds, 3), "drained": drained, "unacked_at_end": unacked,
            "latency_ms": {"figg_publish_ack": good.publish.summary(),
                           "figg_ping": good.ping.summary(),
                           "tank_produce": good.produce.summary(),
                           "figg_to_tank_delivery": good.delivery.summary()},
            "topics": await good.read_back()}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench.soak.good",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--figg", required=True)
    parser.add_argument("--tank", required=True)
    parser.add_argument("--rate", type=float, default=200.0, help="Figg publishes per second")
    parser.add_argument("--tank-rate", type=float, default=50.0, help="Tank produces per second")
    parser.add_argument("--ping-interval", type=float, default=0.02)
    parser.add_argument("--size", type=int, default=100, help="message bytes (at least 16)")
    parser.add_argument("--window", type=int, default=256, help="Figg publish window")
    parser.add_argument("--drain-timeout", type=float, default=15.0)
    parser.add_argument("--max-seconds", type=float, default=3600.0,
                        help="stop after this long even if stdin says nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    configure_logging("error")  # on stderr: stdout carries the JSON lines
    try:
        result = trio.run(run, args)
    except (ClientError, OSError, trio.TooSlowError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
