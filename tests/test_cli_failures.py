"""Every client subcommand of ``figtank``, run as a real process, fails like a good CLI:
one line on stderr naming what failed, a documented exit status (2 usage, 1 runtime,
130 Ctrl-C), nothing on stdout but data, and no reconnect storm or hang."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trio

from gateway.client.tank import open_tank_client
from protocols.tank.bundle import Message
from tests.figg.proxy import dropping_proxy
from tests.ports import free_port
from tests.serving import ServeProcess, figtank_serve

pytestmark = pytest.mark.slow

FIGTANK = [sys.executable, "-m", "gateway.cli"]


def figtank(*args: str, stdin: bytes | None = None, timeout: float = 30
            ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*FIGTANK, *args], input=stdin, capture_output=True,
                          timeout=timeout)


def failed(result: subprocess.CompletedProcess[bytes], status: int, *phrases: str) -> str:
    """Assert ``result`` is a clean failure: ``status``, nothing on stdout, one line on
    stderr holding every phrase. Returns that line."""
    stderr = result.stderr.decode()
    assert result.returncode == status, stderr
    assert result.stdout == b""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def records(result: subprocess.CompletedProcess[bytes]) -> list[dict]:
    """The JSON lines of a successful run (stderr must be empty: no logs by default)."""
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    return [json.loads(line) for line in result.stdout.decode().splitlines()]


def addr(address: tuple[str, int] | None) -> str:
    assert address is not None
    return f"{address[0]}:{address[1]}"




@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    data = tmp_path_factory.mktemp("cli") / "data"
    with figtank_serve("--data-dir", str(data), "--durability", "os",
                       "--tank-listen", "127.0.0.1:0", "--figg-listen", "127.0.0.1:0",
                       "--metrics-listen", "127.0.0.1:0") as served:
        yield served
        served.stop()


def connections_closed(server: ServeProcess, protocol: str) -> int:
    return sum(1 for line in server.events("connection_closed")
               if line.get("protocol") == protocol)


# -- usage mistakes: one line, status 2, before anything is sent -----------------------------

@pytest.mark.parametrize(("args", "phrase"), [
    (["consume", "orders", "--from", "-5"], "--from: must be 0 or more"),
    (["topics", "create", "p7", "--partitions", "70000"], "at most 65530 partitions"),
    (["publish", "bad name", "x"], "invalid topic name 'bad name'"),
    (["subscribe", "bad name"], "invalid topic name 'bad name'"),
    (["subscribe", "orders", "--count", "0"], "--count: must be 1 or more"),
    (["consume", "orders/x"], "orders/x"),
    (["topics", "create", "p5", "--config", "nonsense"], "expected KEY=VALUE, got 'nonsense'"),
    (["topics", "create", "p5", "--config", "log.segmnt.bytes=1"], "'log.segmnt.bytes'"),
    (["topics", "create", "p5", "--config", "log.segment.bytes=abc"], "log.segment.bytes"),
    (["produce", "--timeout", "-1", "orders", "x"], "--timeout"),
    (["nonsense"], "invalid choice"),
])
def test_usage_mistakes_are_one_line_and_status_2(args: list[str], phrase: str) -> None:
    line = failed(figtank(*args), 2, phrase)
    assert line.startswith("figtank") and "--help" in line


def test_version() -> None:
    result = figtank("--version")
    assert result.returncode == 0
    assert result.stdout.decode().startswith("figtank ")


# -- unreachable, wrong and refusing servers -------------------------------------------------

def test_unreachable_servers_are_one_line_soon() -> None:
    port = free_port()
    started = time.monotonic()
    failed(figtank("publish", "--figg", f"127.0.0.1:{port}", "orders", "x"), 1,
           "figtank publish:", f"could not connect to 127.0.0.1:{port}", "Connection refused")
    failed(figtank("subscribe", "--figg", f"127.0.0.1:{port}", "orders"), 1,
           "figtank subscribe:", "Connection refused")
    line = failed(figtank("consume", "--tank", f"127.0.0.1:{port}", "orders"), 1,
                  "figtank consume:", "Connection refused")
    assert line.count(str(port)) == 1  # the address once, not twice
    assert time.monotonic() - started < 20


def test_a_refused_request_ends_after_a_few_connections(server: ServeProcess) -> None:
    # kt has one partition: kt/7 is refused. The command gives up with the request named,
    # after a handful of connections, not thousands.
    created = figtank("topics", "--tank", addr(server.tank), "create", "kt")
    assert created.returncode == 0, created.stderr
    for command in (["publish", "kt/7", "x"], ["subscribe", "kt/7"]):
        before = connections_closed(server, "figg")
        started = time.monotonic()
        failed(figtank(command[0], "--figg", addr(server.figg), *command[1:]), 1,
               f"figtank {command[0]}:", "'kt/7'", "refuses")
        assert time.monotonic() - started < 15
        time.sleep(0.3)  # the server logs each closed connection
        assert connections_closed(server, "figg") - before <= 3


def test_a_port_that_is_not_figg_gives_up(server: ServeProcess) -> None:
    started = time.monotonic()
    failed(figtank("publish", "--figg", addr(server.tank), "--timeout", "2", "orders", "x"), 1,
           "figtank publish:", "a Figg server?")
    assert time.monotonic() - started < 10


def test_errors_name_the_cause(server: ServeProcess) -> None:
    tank = addr(server.tank)
    assert figtank("topics", "--tank", tank, "create", "named").returncode == 0
    failed(figtank("produce", "--tank", tank, "named/5", "x"), 1,
           "named/5", "no such partition (code 1)")
    failed(figtank("topics", "--tank", tank, "create", "named"), 1, "already exists")
    failed(figtank("topics", "--tank", tank, "describe", "never-made"), 1, "never-made")


def test_bridge_without_upstream_says_so(tmp_path: Path) -> None:
    with figtank_serve("--upstream", f"127.0.0.1:{free_port()}", "--tank-listen",
                       "127.0.0.1:0", "--figg-listen", "127.0.0.1:0", "--metrics-listen",
                       "") as bridge:
        tank = addr(bridge.tank)
        # The bridge waits a few seconds for its upstream on each request: both at once,
        # with room for the bridge's answer on a busy machine (its waits add up to about
        # the client's default 10 s).
        with ThreadPoolExecutor() as pool:
            produced = pool.submit(figtank, "produce", "--tank", tank, "--timeout", "30",
                                   "orders", "x")
            status = pool.submit(figtank, "status", "--tank", tank, "--timeout", "30")
            published = pool.submit(figtank, "publish", "--figg", addr(bridge.figg),
                                    "--timeout", "3", "orders", "x")
        failed(produced.result(), 1,
               "figtank produce:", "orders/0", "a bridge without its upstream broker")
        failed(status.result(), 1,
               "figtank status:", "closed the connection without answering")
        failed(published.result(), 1, "figtank publish:", "0 of 1 message acknowledged")


# -- stdout carries data only ----------------------------------------------------------------

def test_options_may_follow_a_topics_action(server: ServeProcess) -> None:
    tank = addr(server.tank)
    created = records(figtank("topics", "create", "after", "--partitions", "2", "--json",
                              "--tank", tank))
    assert created == [{"topic": "after", "partitions": 2}]
    listed = records(figtank("topics", "list", "--json", "--tank", tank))
    assert {"topic": "after", "partitions": 2} in listed
    described = records(figtank("topics", "--tank", tank, "describe", "after", "--json"))
    assert [d["partition"] for d in described] == [0, 1]


def test_payloads_are_unambiguous_in_text_and_json(server: ServeProcess) -> None:
    tank, figg = addr(server.tank), addr(server.figg)
    values = [b"\xff\x00\xfe", b"0xff00fe", b"tab\there", b"back\\slash", b"caf\xc3\xa9"]
    stdin = b"".join(v + b"\n" for v in values[:3]) + b"back\\slash\ncaf\xc3\xa9"
    produced = records(figtank("produce", "--tank", tank, "--json", "enc", "-", stdin=stdin))
    assert produced[0]["produced"] == 5
    # One message: one line. Newlines inside a value need the argument form.
    newline = figtank("produce", "--tank", tank, "enc", "two\nlines")
    assert newline.stdout.decode() == "1 message produced to enc/0 (high-water mark 6)\n"

    consumed = records(figtank("consume", "--tank", tank, "--json", "enc"))
    decoded = [base64.b64decode(m["value_base64"]) if m["value"] is None
               else m["value"].encode() for m in consumed]
    assert decoded == [*values, b"two\nlines"]
    assert consumed[0]["value"] is None and consumed[1] == {**consumed[1], "value": "0xff00fe"}

    text = figtank("consume", "--tank", tank, "enc")
    shown = [line.split("\t")[3] for line in text.stdout.decode().splitlines()]
    assert shown == ["\\xff\\x00\\xfe", "0xff00fe", "tab\\there", "back\\\\slash", "café",
                     "two\\nlines"]

    subscribed = records(figtank("subscribe", "--figg", figg, "--json", "enc", "--from", "0",
                                 "--count", "2"))
    assert subscribed[0] == {"topic": "enc", "offset": 1, "data": None,
                             "data_base64": base64.b64encode(values[0]).decode()}


def test_publish_reads_stdin_and_subscribe_stops_by_count_or_idle(server: ServeProcess
                                                                  ) -> None:
    figg = addr(server.figg)
    published = records(figtank("publish", "--figg", figg, "--json", "lines", "-",
                                stdin=b"one\ntwo\nthree\n"))
    assert published == [{"topic": "lines", "published": 3}]
    single = figtank("publish", "--figg", figg, "lines", "four")
    assert single.stdout.decode() == "1 message published to lines and acknowledged\n"

    counted = records(figtank("subscribe", "--figg", figg, "--json", "lines", "--from", "1",
                              "--count", "2"))
    assert [m["data"] for m in counted] == ["two", "three"]
    idle = records(figtank("subscribe", "--figg", figg, "--json", "lines", "--from", "0",
                           "--idle", "0.5"))
    assert [m["data"] for m in idle] == ["one", "two", "three", "four"]

    # Past the end: it says (on stderr) where it really starts, and stdout stays empty.
    beyond = figtank("subscribe", "--figg", figg, "lines", "--from", "1000000", "--idle", "0.3")
    assert beyond.returncode == 0 and beyond.stdout == b""
    assert beyond.stderr.decode() == \
        "figtank: lines: starting after offset 4 (asked for after 1000000)\n"


class Running:
    """A ``figtank`` command running in the background; its stdout lines are collected."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([*FIGTANK, *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)
        self.lines: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        self.lines.extend(self.process.stdout)

    async def wait_lines(self, count: int, timeout: float = 15) -> None:
        with trio.fail_after(timeout):
            while len(self.lines) < count:
                await trio.sleep(0.02)

    async def finish(self, timeout: float = 15) -> tuple[int, str]:
        """Wait for the exit: (status, stderr); killed if it does not end in time."""
        try:
            status = await trio.to_thread.run_sync(lambda: self.process.wait(timeout))
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self._reader.join(5)
        assert self.process.stderr is not None
        return status, self.process.stderr.read().decode()


async def produce(server: ServeProcess, topic: str, *values: bytes) -> None:
    assert server.tank is not None
    async with open_tank_client(*server.tank) as client:
        await client.produce({(topic, 0): [Message(v) for v in values]})


async def test_ctrl_c_on_subscribe_exits_130_quietly(server: ServeProcess) -> None:
    running = Running("subscribe", "--figg", addr(server.figg), "interrupted", "--from", "0")
    await produce(server, "interrupted", b"first")
    await running.wait_lines(1)
    running.process.send_signal(signal.SIGINT)
    status, stderr = await running.finish()
    assert (status, stderr) == (130, "")
    assert running.lines == [b"1\tfirst\n"]


async def test_subscribe_json_stays_pure_across_a_reconnect(server: ServeProcess) -> None:
    assert server.figg is not None
    async with dropping_proxy(*server.figg) as proxy:
        running = Running("subscribe", "--figg", f"127.0.0.1:{proxy.port}", "--json", "cut",
                          "--from", "0", "--count", "4")
        await produce(server, "cut", b"a", b"b")
        await running.wait_lines(2)
        proxy.drop()
        await produce(server, "cut", b"c", b"d")
        status, stderr = await running.finish()
    assert status == 0, stderr
    assert [json.loads(line)["data"] for line in running.lines] == ["a", "b", "c", "d"]
    # The lost connection is a warning on stderr, never a line among the data.
    assert "figg_disconnected" in stderr and proxy.connections >= 2


# -- files -----------------------------------------------------------------------------------

def test_inspect_wants_a_partition_directory(server: ServeProcess, tmp_path: Path) -> None:
    data = Path(next(line["data_dir"] for line in server.events("figtank_serving")))
    assert figtank("produce", "--tank", addr(server.tank), "inspected", "x").returncode == 0
    failed(figtank("inspect", str(data)), 1, "figtank inspect:", "partition directory",
           str(data / "inspected" / "0"))
    failed(figtank("inspect", str(tmp_path / "nowhere")), 1, "figtank inspect:", "nowhere")
    shown = figtank("inspect", str(data / "inspected" / "0"))
    assert shown.returncode == 0 and shown.stdout.decode().splitlines()[-1].startswith("1\t")


def test_bench_failures_are_one_line() -> None:
    failed(figtank("bench", "figg-publish", "--messages", "-3"), 2, "--messages")
    failed(figtank("bench", "tank-produce", "--tank", f"127.0.0.1:{free_port()}",
                   "--messages", "10"), 1, "figtank bench:", "Connection refused")
