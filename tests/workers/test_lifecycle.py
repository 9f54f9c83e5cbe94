"""The supervisor of ``figtank serve --workers N``: a killed worker is started again, a
signal stops them all, a worker that can not start is not started in a tight loop, and
the embedded store is refused."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import trio

from gateway.client.tank import open_tank_client
from tests.workers.helpers import (
    alive,
    samples,
    scrape,
    total,
    upstream_and_gateway,
    wait_for,
    worker_pids,
)

FIGTANK = (sys.executable, "-m", "gateway.cli")


async def produce_on_many(served_tank: tuple[str, int], topic: str, connections: int) -> None:
    """One message on each of ``connections`` new connections (so both workers)."""
    for i in range(connections):
        async with open_tank_client(*served_tank, request_timeout=10) as tank:
            await tank.produce({(topic, 0): [b"c%02d" % i]})


def _when(line: dict) -> float:
    return datetime.fromisoformat(line["timestamp"]).timestamp()


async def test_a_killed_worker_is_started_again(tmp_path: Path) -> None:
    async with upstream_and_gateway(tmp_path) as (upstream, _, served):
        assert served.tank
        first = worker_pids(served)
        with trio.fail_after(60):
            await produce_on_many(served.tank, "before", 10)
            await wait_for(lambda: total(scrape(served)[1], "figtank_requests_total",
                                         type="produce") == 10)
            os.kill(first[0], signal.SIGKILL)
            await wait_for(lambda: len(served.events("worker_serving")) == 3)
            exited = served.events("worker_exited")
            assert [(e["worker"], e["status"], e["served"]) for e in exited] == [
                (0, -signal.SIGKILL, True)]
            again = served.events("worker_serving")[-1]
            assert again["worker"] == 0 and again["pid"] not in first
            assert alive(first[1])
            # Serving resumes on both, and the counts of the killed one are kept.
            await produce_on_many(served.tank, "after", 10)
            await wait_for(lambda: total(scrape(served)[1], "figtank_requests_total",
                                         type="produce") == 20)
        assert len(await upstream.stored("before")) == 10
        assert len(await upstream.stored("after")) == 10
        text = scrape(served)[1]
        assert total(text, "figtank_worker_restarts_total", worker="0") == 1
        assert total(text, "figtank_worker_restarts_total", worker="1") == 0
        pids = {labels["pid"] for labels, _ in
                samples(text, "figtank_worker_connections_accepted_total")}
        assert pids == {str(again["pid"]), str(first[1])}
        assert scrape(served, "/health") == (200, "ready\n")


async def test_sigterm_stops_every_worker_within_the_grace(tmp_path: Path) -> None:
    grace = 2.0
    async with upstream_and_gateway(tmp_path, grace=grace) as (_, front, served):
        assert served.tank
        pids = worker_pids(served)
        # An idle connection on each worker: told to stop, each closes at once.
        streams = [await trio.open_tcp_stream(*served.tank) for _ in range(8)]
        began = time.monotonic()
        status = await front.stop(signal.SIGTERM)
        took = time.monotonic() - began
        for stream in streams:
            await stream.aclose()
    assert status == 0
    assert took < grace + 5, took
    assert not any(alive(pid) for pid in pids)
    stopped = served.events("worker_stopped")
    assert sorted((e["worker"], e["status"]) for e in stopped) == [(0, 0), (1, 0)]
    assert served.events("figtank_stopped")[-1]["workers"] == 2


async def test_a_killed_supervisor_leaves_no_worker(tmp_path: Path) -> None:
    async with upstream_and_gateway(tmp_path) as (_, front, served):
        pids = worker_pids(served)
        await front.kill()
        with trio.fail_after(20):
            while any(alive(pid) for pid in pids):
                await trio.sleep(0.1)


async def test_workers_that_keep_failing_to_start_are_backed_off_then_given_up(
        tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text('default = "allow"\n')
    async with upstream_and_gateway(tmp_path, more=("--policy-file", str(policy))
                                    ) as (_, _, served):
        pids = worker_pids(served)
        policy.write_text("this is not TOML [")  # a restarted worker can not start now
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        with trio.fail_after(60):
            await trio.to_thread.run_sync(served.process.wait)
        status = served.stop()  # it exited: this reads its last lines
    assert status == 2
    for worker in (0, 1):
        starts = [_when(e) for e in served.events("worker_started") if e["worker"] == worker]
        exits = [e for e in served.events("worker_exited") if e["worker"] == worker]
        # The first start, then the one at once after the kill, then 0.5, 1 and 2 s
        # after each failure: the fourth failure in a row of both gives up.
        assert len(starts) == 5, starts
        assert [e["served"] for e in exits] == [True, False, False, False, False]
        assert [e.get("restart_in_secs") for e in exits][:4] == [0, 0.5, 1, 2]
        waits = [b - a for a, b in itertools.pairwise(starts[1:])]
        for wait, least in zip(waits, (0.5, 1, 2), strict=True):
            assert wait >= least, waits
    assert [e["action"] for e in served.events("worker_exited")][-1] == "give_up"
    assert served.events("workers_failed")
    lines = [line["raw"] for line in served.log_lines if "raw" in line]
    assert any("every worker (2) failed to start 4 times in a row" in line for line in lines)
    assert any("auth.policy_file" in line for line in lines)


def test_every_worker_failing_at_first_gives_up_at_once(tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text("not TOML [")
    result = subprocess.run(
        [*FIGTANK, "serve", "--workers", "2", "--upstream", "127.0.0.1:9",
         "--policy-file", str(policy), "--tank-listen", "127.0.0.1:0", "--figg-listen", "",
         "--kafka-listen", "", "--http-listen", "", "--metrics-listen", "",
         "--log-format", "json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("figtank: configuration error: auth.policy_file") == 2
    assert result.stderr.splitlines()[-1].startswith(
        "figtank: serve failed: every worker (2) failed to start 1 time in a row "
        "(exit status 2)")


def test_a_port_in_use_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:  # listening, as another program would
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*FIGTANK, "serve", "--workers", "2", "--upstream", "127.0.0.1:9",
             "--tank-listen", f"127.0.0.1:{port}", "--figg-listen", "", "--kafka-listen",
             "", "--http-listen", "", "--metrics-listen", ""],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"figtank: configuration error: listen.tank: cannot listen on 127.0.0.1:{port}: "
        "the address is already in use; stop what holds it or choose another address "
        "with --tank-listen HOST:PORT"]


async def test_another_figtank_with_workers_can_not_join_the_port(tmp_path: Path) -> None:
    async with upstream_and_gateway(tmp_path) as (upstream, _, served):
        assert served.tank
        port = served.tank[1]
        result = await trio.to_thread.run_sync(lambda: subprocess.run(
            [*FIGTANK, "serve", "--workers", "2", "--upstream", upstream.tank,
             "--tank-listen", f"127.0.0.1:{port}", "--figg-listen", "", "--kafka-listen",
             "", "--http-listen", "", "--metrics-listen", ""],
            capture_output=True, text=True, timeout=60))
        assert result.returncode == 2
        assert "listen.tank: cannot listen on" in result.stderr


@pytest.mark.parametrize("workers", ["2", "auto"])
def test_the_embedded_store_is_refused(tmp_path: Path, workers: str) -> None:
    if workers == "auto" and len(os.sched_getaffinity(0)) == 1:
        workers = "2"  # auto is 1 here, which is allowed
    result = subprocess.run(
        [*FIGTANK, "serve", "--workers", workers, "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    count = len(os.sched_getaffinity(0)) if workers == "auto" else 2
    assert result.stderr.splitlines() == [
        f"figtank: configuration error: server.workers: {count} workers need an upstream "
        "(--upstream or --upstream-kafka): the embedded store is one process's and can "
        "not be shared; run one worker"]
    assert not (tmp_path / "data").exists()



async def test_sighup_reaches_every_worker(tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text('default = "allow"\n')
    async with upstream_and_gateway(tmp_path, more=("--policy-file", str(policy))
                                    ) as (_, _, served):
        served.process.send_signal(signal.SIGHUP)

        def reloaded() -> bool:
            return sorted(e.get("worker", -1) for e in served.events("reloaded")
                          if "access policy" in e.get("what", "")) == [0, 1]

        await wait_for(reloaded)
        assert served.process.poll() is None
        assert scrape(served, "/health") == (200, "ready\n")
