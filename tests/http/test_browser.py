"""The console and the browser clients in a real headless Chromium, against ``figtank
serve`` in a subprocess: the page lists a topic created over Tank, a message published
over Figg appears in the live tail within a second, and an EventSource and the
WebSocket client (figtank.js) resume across a server restart with every message exactly
once and in order. Screenshots go to the test's tmp dir (printed)."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from gateway.client.figg_blocking import BlockingFiggClient
from gateway.client.tank_blocking import BlockingTankClient
from tests.http.access_helpers import READER, WRITER, policy
from tests.http.browser import chromium, free_port, screenshot
from tests.serving import figtank_serve


def _serve(data: Path, http_port: int, *more: str) -> object:
    return figtank_serve("--data-dir", str(data), "--durability", "os",
                         "--tank-listen", "127.0.0.1:0", "--figg-listen", "127.0.0.1:0",
                         "--metrics-listen", "", "--http-listen", f"127.0.0.1:{http_port}",
                         *more)


def _post(base: str, topic: str, value: str, token: str | None = None) -> int:
    request = urllib.request.Request(f"{base}/topics/{topic}", data=value.encode(),
                                     method="POST", headers={
                                         "Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["offsets"][0]["offset"]


def _topics_text(page) -> str:
    """The topics table's text, read in one script (the console re-renders it on every
    poll: an element found first may be stale by the time its text is asked)."""
    return page.execute_script("return document.getElementById('topics').innerText")


def test_console_lists_a_tank_topic_and_tails_a_figg_publish(tmp_path):
    port = free_port()
    with _serve(tmp_path / "data", port) as served, chromium(tmp_path / "profile") as page:
        with BlockingTankClient(*served.tank) as tank:
            tank.create_topic("made-over-tank", 2)
        base = f"http://127.0.0.1:{port}"
        page.get(f"{base}/")
        WebDriverWait(page, 10).until(
            lambda d: "made-over-tank" in _topics_text(d))
        rows = _topics_text(page)
        assert "made-over-tank" in rows
        screenshot(page, tmp_path / "console-topics.png")

        # Found and clicked in one script: the console re-renders the table on every poll,
        # so a button found first may be gone by the time a click is sent (stale).
        page.execute_script(
            'document.querySelector(\'button[data-topic="made-over-tank"]\').click()')
        WebDriverWait(page, 10).until(
            lambda d: d.execute_script("return window.figtankConsole.tailState()") == 1)
        with BlockingFiggClient(*served.figg) as figg:
            figg.wait_connected(10)
            figg.publish_and_wait("made-over-tank", b"hello from figg")
            published = time.monotonic()
        WebDriverWait(page, 1.0, poll_frequency=0.02).until(
            lambda d: "hello from figg" in d.find_element(By.ID, "tail").text)
        assert time.monotonic() - published < 1.0
        assert "0:1 hello from figg" in page.find_element(By.ID, "tail").text
        time.sleep(2.5)  # more polls: the rates chart has points
        screenshot(page, tmp_path / "console-tail.png")


CLIENTS = """
window.gotSse = []; window.gotWs = []; window.states = [];
window.source = new EventSource("/topics/resume/events?from=earliest");
window.source.onmessage = (e) => window.gotSse.push(JSON.parse(e.data).offset);
window.fig = new Figtank("ws://" + location.host + "/ws", {minDelay: 100, maxDelay: 1000,
  onstate: (state, code, reason) => window.states.push(state + ":" + (reason || ""))});
window.fig.subscribe("resume", (m) => window.gotWs.push(m.offset), {from: "earliest"});
"""


def _counts(page) -> tuple[int, int]:
    return tuple(page.execute_script("return [window.gotSse.length, window.gotWs.length]"))


def test_eventsource_and_websocket_client_resume_across_a_restart(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    with chromium(tmp_path / "profile") as page:
        with _serve(data, port):
            _post(base, "resume", "m1")
            page.get(f"{base}/")
            page.execute_script(CLIENTS)
            for i in range(2, 61):
                _post(base, "resume", f"m{i}")
            WebDriverWait(page, 10, poll_frequency=0.02).until(lambda d: min(_counts(d)) >= 5)
        # The server stopped mid-stream (SIGTERM): both clients lost their connection.
        with _serve(data, port):
            for i in range(61, 101):
                _post(base, "resume", f"m{i}")
            WebDriverWait(page, 20, poll_frequency=0.1).until(
                lambda d: _counts(d) == (100, 100))
            time.sleep(0.5)  # nothing more arrives
            sse, ws = page.execute_script("return [window.gotSse, window.gotWs]")
            screenshot(page, tmp_path / "console-after-restart.png")
        assert sse == list(range(1, 101))
        assert ws == list(range(1, 101))

        # A server whose log is shorter than where the clients stood (a new data directory:
        # the topic re-created). EventSource's Last-Event-ID 100 is past the end: 416, and
        # it stops (a browser does not retry an answer that is not an event stream) rather
        # than start at the end and skip what the topic has. figtank.js is told where the
        # server starts ("rewound") and delivers the new log from its first message.
        with _serve(tmp_path / "fresh", port):
            for i in range(1, 4):
                _post(base, "resume", f"n{i}")
            WebDriverWait(page, 20, poll_frequency=0.1).until(lambda d: _counts(d)[1] == 103)
            WebDriverWait(page, 20, poll_frequency=0.1).until(  # EventSource.CLOSED
                lambda d: d.execute_script("return window.source.readyState") == 2)
            time.sleep(0.3)  # nothing more arrives
            sse, ws, states = page.execute_script(
                "return [window.gotSse, window.gotWs, window.states]")
    assert sse == list(range(1, 101))
    assert ws[100:] == [1, 2, 3]
    assert [s for s in states if s.startswith("rewound")] == [
        "rewound:resume/0 starts after offset 0, 100 was delivered"]


REVOKED = """
window.gotSse = []; window.gotWs = []; window.revoked = []; window.states = [];
window.source = new EventSource("/topics/news/events?from=earliest&access_token=TOKEN");
window.source.onmessage = (e) => window.gotSse.push(JSON.parse(e.data).offset);
window.source.addEventListener("revoked", (e) => window.revoked.push(JSON.parse(e.data)));
window.fig = new Figtank("ws://" + location.host + "/ws", {
  token: "TOKEN", minDelay: 100, maxDelay: 200,
  onstate: (state, code) => window.states.push(state + ":" + (code || ""))});
window.fig.subscribe("news", (m) => window.gotWs.push(m.offset), {from: "earliest"});
"""


def test_a_reload_that_revokes_access_ends_eventsource_and_figtank_js(tmp_path):
    """In the browser: SIGHUP with a policy that no longer lets the reader subscribe ends
    its EventSource (a last "revoked" event; the reconnect is refused, so it stays closed)
    and its figtank.js client (close 4003: it stops instead of reconnecting)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    access = tmp_path / "access.toml"
    access.write_text(policy('["news"]'))
    with chromium(tmp_path / "profile") as page, \
            _serve(tmp_path / "data", port, "--policy-file", str(access)) as served:
        _post(base, "news", "n1", WRITER)
        page.get(f"{base}/")  # the console page loads figtank.js
        page.execute_script(REVOKED.replace("TOKEN", READER))
        WebDriverWait(page, 10, poll_frequency=0.02).until(lambda d: d.execute_script(
            "return window.gotSse.length === 1 && window.gotWs.length === 1"))
        access.write_text(policy('["none"]'))
        served.process.send_signal(signal.SIGHUP)
        WebDriverWait(page, 10, poll_frequency=0.05).until(lambda d: d.execute_script(
            "return window.source.readyState === 2 && window.states.includes('revoked:4003')"))
        time.sleep(1.0)  # figtank.js would have come back by now (100-200 ms backoff)
        revoked, states = page.execute_script("return [window.revoked, window.states]")
    assert [r["error"] for r in revoked] == ["access_revoked"]
    assert "may no longer subscribe to 'news'" in revoked[0]["message"]
    assert states == ["open:", "revoked:4003"]
    assert len(served.events("http_stream_revoked")) == 2
