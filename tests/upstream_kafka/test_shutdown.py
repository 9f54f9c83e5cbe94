"""SIGTERM to a gateway in upstream-Kafka mode: with nothing in flight it exits at once;
with publishes in flight its producer delivers what it can within the grace period (and
no longer, even when the upstream does not answer), and nothing acknowledged is lost.

The bounds asserted are generous (a loaded machine is slow); they are far below the
producer's delivery timeout (10 s), which an unbounded flush would wait for."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import trio

from gateway.client.errors import ClientError
from gateway.client.figg import open_figg_client
from tests.serving import Served
from tests.upstream_kafka.helpers import AnyUpstream, upstream_and_gateway

#: Seconds a SIGTERM'd gateway may take to exit beyond its grace period.
EXIT_BOUND = 3.0


async def stopped_in(front: Served) -> tuple[int, float]:
    """SIGTERM the gateway: its exit status and the seconds it took."""
    started = time.monotonic()
    code = await front.stop(signal.SIGTERM)
    return code, time.monotonic() - started


async def publish_burst(address: tuple[str, int], count: int, acked: set[bytes],
                        wait: bool) -> None:
    """Publish ``count`` messages (a window of 256), recording the acknowledged ones; keep
    the client open until the gateway goes away."""
    async with open_figg_client(*address, window=256, max_refusals=1) as client:
        for i in range(count):
            value = b"m-%05d" % i
            await client.publish("burst", value, on_ack=lambda _, v=value: acked.add(v))
        if wait:
            await client.wait_all_acked()
        await trio.sleep_forever()


async def test_an_idle_gateway_exits_at_once(tmp_path: Path, upstream: AnyUpstream) -> None:
    async with upstream_and_gateway(tmp_path, upstream=upstream) as (_, front, served):
        with trio.fail_after(60):
            assert served.figg
            async with open_figg_client(*served.figg) as client:
                for i in range(5):
                    await client.publish_and_wait("idle", b"%d" % i)
                code, seconds = await stopped_in(front)
            lines = served.log_lines
    assert code == 0
    assert seconds < EXIT_BOUND, f"an idle gateway took {seconds:.1f} s to exit"
    assert not [line for line in lines if line.get("event") == "upstream_unacknowledged_at_stop"]


async def test_in_flight_publishes_are_flushed_and_nothing_acknowledged_is_lost(
        tmp_path: Path, upstream: AnyUpstream) -> None:
    acked: set[bytes] = set()
    async with upstream_and_gateway(tmp_path, upstream=upstream) as (_, front, served):
        with trio.fail_after(60):
            assert served.figg
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_tolerating_the_end, publish_burst, served.figg, 3000,
                                   acked, False)
                while len(acked) < 200:
                    await trio.sleep(0.01)
                code, seconds = await stopped_in(front)  # acks still coming in
                nursery.cancel_scope.cancel()
            stored = {value for _, value in await upstream.stored("burst")}
    assert code == 0
    assert seconds < 0.2 + EXIT_BOUND  # the helper's --grace 0.2
    assert acked and acked <= stored  # every acknowledged message is upstream


async def test_an_unanswering_upstream_holds_the_exit_only_for_the_grace(
        tmp_path: Path, upstream: AnyUpstream) -> None:
    """The upstream stopped (SIGSTOP: connections open, nothing answered) while publishes
    are in flight: the gateway exits after its grace period, saying how many messages it
    could not deliver; none of them had been acknowledged."""
    acked: set[bytes] = set()
    async with upstream_and_gateway(tmp_path, upstream=upstream) as (_, front, served):
        with trio.fail_after(60):
            assert served.figg
            pid = upstream.pid
            async with open_figg_client(*served.figg) as client:
                for i in range(20):
                    await client.publish_and_wait("stuck", b"before-%d" % i)
                os.kill(pid, signal.SIGSTOP)
                try:
                    await stopped(pid)
                    for i in range(50):
                        value = b"during-%d" % i
                        await client.publish("stuck", value,
                                             on_ack=lambda _, v=value: acked.add(v))
                    await trio.sleep(0.3)
                    code, seconds = await stopped_in(front)
                finally:
                    os.kill(pid, signal.SIGCONT)
            lines = served.log_lines
            stored = [value for _, value in await upstream.stored("stuck")]
    assert code == 0
    assert seconds < 0.2 + EXIT_BOUND, f"the exit took {seconds:.1f} s"
    assert not acked  # nothing in flight was acknowledged
    [left] = [line for line in lines if line.get("event") == "upstream_unacknowledged_at_stop"]
    assert left["messages"] > 0
    assert stored[:20] == [b"before-%d" % i for i in range(20)]


async def stopped(pid: int) -> None:
    """Wait until every thread of ``pid`` is stopped: a SIGSTOP takes effect a moment
    after kill() returns, and on a busy machine a fast upstream (Tansu) can still answer
    what arrives meanwhile."""
    with trio.fail_after(5):
        while not all(_state(task) == "T" for task in Path(f"/proc/{pid}/task").iterdir()):
            await trio.sleep(0.01)


def _state(task: Path) -> str:
    try:
        return (task / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "T"  # a thread that has gone is not running either


async def _tolerating_the_end(fn, *args) -> None:  # type: ignore[no-untyped-def]
    """Run a client until cancelled; the gateway going away is expected."""
    try:
        await fn(*args)
    except ClientError:
        await trio.sleep_forever()
