"""figtank.js in a real headless Chromium against ``figtank serve`` in a subprocess (one
server and one browser for the module): the ES module (``<script type="module">``) keeps
within the server's publish window; the classic script asks the page for a fresh token
when its JWT expires (close 4001) or is refused (401 on the probe) and its subscription
goes on exactly once and in order; a refusal (a probe's 403, a close 1008) stops it with
no attempt to come back, as the server's log shows."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from selenium.webdriver.support.ui import WebDriverWait

from tests.http.access_helpers import READER, WRITER, policy
from tests.http.browser import chromium, free_port
from tests.serving import ServeProcess, figtank_serve

SECRET = "a-shared-secret-for-the-browser-tests-01"
WINDOW = 4


class Setup:
    def __init__(self, served: ServeProcess, port: int, page: Any) -> None:
        self.served = served
        self.base = f"http://127.0.0.1:{port}"
        self.port = port
        self.page = page

    def post(self, topic: str, value: str) -> None:
        request = urllib.request.Request(f"{self.base}/topics/{topic}", data=value.encode(),
                                         method="POST",
                                         headers={"Authorization": f"Bearer {WRITER}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def until(self, script: str, timeout: float = 10) -> Any:
        WebDriverWait(self.page, timeout, poll_frequency=0.05).until(
            lambda d: d.execute_script(script))

    def refused(self, status: int) -> list[dict]:
        return [e for e in self.served.events("http_request_refused")
                if e.get("path") == "/ws" and e.get("status") == status
                and e.get("method") == "GET"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("figtank-js")
    (tmp / "access.toml").write_text(policy('["news"]'))
    (tmp / "hs256.key").write_text(SECRET)
    (tmp / "figtank.toml").write_text(
        f'[http]\nws_publish_window = {WINDOW}\n'
        f'jwt_hs256_secret_file = "{tmp / "hs256.key"}"\n')
    port = free_port()
    with figtank_serve("--config", str(tmp / "figtank.toml"), "--data-dir", str(tmp / "data"),
                       "--durability", "os", "--tank-listen", "", "--figg-listen", "",
                       "--kafka-listen", "", "--metrics-listen", "",
                       "--http-listen", f"127.0.0.1:{port}",
                       "--policy-file", str(tmp / "access.toml")) as served, \
            chromium(tmp / "profile") as page:
        yield Setup(served, port, page)


MODULE_WINDOW = """
// Counted on the wire, outside the client: publishes sent minus acks received.
window.inFlightNow = 0; window.maxInFlight = 0;
const Native = window.WebSocket;
window.WebSocket = class extends Native {
  constructor(...args) {
    super(...args);
    this.addEventListener("message", (e) => {
      if (JSON.parse(e.data).op === "ack") window.inFlightNow--;
    });
  }
  send(data) {
    if (JSON.parse(data).op === "publish") {
      window.maxInFlight = Math.max(window.maxInFlight, ++window.inFlightNow);
    }
    super.send(data);
  }
};
const script = document.createElement("script");
script.type = "module";
script.textContent = `
  import {Figtank} from "/figtank.mjs";
  window.ModuleFigtank = Figtank;
  window.states = [];
  const fig = new Figtank("ws://" + location.host + "/ws", {token: "WRITER",
    onstate: (state, code) => window.states.push(state + ":" + (code || ""))});
  const acks = [];
  for (let i = 1; i <= 50; i++) acks.push(fig.publish("window", "w" + i));
  Promise.all(acks).then((done) => { window.acks = done.map((a) => a.offset); });
`;
document.head.appendChild(script);
"""


def test_the_module_keeps_within_the_publish_window(setup: Setup) -> None:
    page = setup.page
    page.get(f"{setup.base}/")
    page.execute_script(MODULE_WINDOW.replace("WRITER", WRITER))
    setup.until("return window.acks !== undefined")
    acks, most, states, same = page.execute_script(
        "return [window.acks, window.maxInFlight, window.states, "
        "window.ModuleFigtank !== window.Figtank && typeof window.Figtank === 'function']")
    assert acks == list(range(1, 51))  # all acknowledged, in order
    assert most == WINDOW  # the window used, never passed
    assert states == ["open:"]
    assert same  # the module and the console's classic script, side by side
    assert not [e for e in setup.served.events("websocket_closed") if e.get("code") == 1008]


REFRESH = """
window.got = []; window.states = []; window.asked = 0; window.fresh = FRESH;
window.fig = new Figtank("ws://" + location.host + "/ws", {
  token: "SHORT", minDelay: 100, maxDelay: 200,
  getToken: () => new Promise((resolve) => {
    window.asked++;
    setTimeout(() => resolve(window.fresh.shift()), 50);
  }),
  onstate: (state, code) => window.states.push(state + ":" + (code || ""))});
window.fig.subscribe("expiry", (m) => window.got.push([m.offset, m.value]), {from: "earliest"});
// Refused at once (401 on the probe): with a hook it asks; without, it stops.
window.late = []; window.lateStates = []; window.noHook = [];
window.fig2 = new Figtank("ws://" + location.host + "/ws", {token: "EXPIRED",
  getToken: async () => window.fresh.shift(),
  onstate: (state, code) => window.lateStates.push(state + ":" + (code || ""))});
window.fig2.subscribe("expiry", (m) => window.late.push(m.offset), {from: "earliest"});
window.fig3 = new Figtank("ws://" + location.host + "/ws", {token: "EXPIRED",
  onstate: (state, code) => window.noHook.push(state + ":" + (code || ""))});
"""


def test_the_classic_script_refreshes_an_expired_token(setup: Setup) -> None:
    page = setup.page
    page.get(f"{setup.base}/")
    expires = time.time() + 2
    short = jwt.encode({"sub": "jwt-alice", "exp": expires}, SECRET, algorithm="HS256")
    expired = jwt.encode({"sub": "jwt-alice", "exp": time.time() - 10}, SECRET,
                         algorithm="HS256")
    fresh = [jwt.encode({"sub": "jwt-alice", "exp": time.time() + 600, "n": n}, SECRET,
                        algorithm="HS256") for n in range(2)]
    for i in range(1, 6):
        setup.post("expiry", f"e{i}")
    page.execute_script(REFRESH.replace("FRESH", json.dumps(fresh)).replace(
        "SHORT", short).replace("EXPIRED", expired))
    setup.until("return window.got.length === 5 && window.late.length === 5")
    setup.until("return window.states.includes('expired:4001')", timeout=expires - time.time()
                + 3)
    for i in range(6, 11):
        setup.post("expiry", f"e{i}")
    setup.until("return window.got.length >= 10 && window.late.length >= 10")
    time.sleep(0.3)  # nothing more arrives
    got, states, asked, late, late_states, no_hook = page.execute_script(
        "return [window.got, window.states, window.asked, window.late, window.lateStates, "
        "window.noHook]")
    assert got == [[i, f"e{i}"] for i in range(1, 11)]  # once each, in order
    assert states == ["open:", "expired:4001", "open:"] and asked == 1
    assert late == list(range(1, 11))
    assert late_states == ["expired:401", "open:"]
    assert no_hook == ["unauthorized:401"]
    [line] = setup.served.events("http_stream_expired")
    assert line["stream"] == "websocket"
    page.execute_script("window.fig.close(); window.fig2.close();")


REFUSED = """
window.states = []; window.rejected = [];
window.fig = new Figtank("ws://127.0.0.1:PORT/ws", {token: "READER",
  minDelay: 100, maxDelay: 200,
  onstate: (state, code) => window.states.push(state + ":" + (code || ""))});
window.fig.publish("news", "never").catch((e) => window.rejected.push(e.message));
window.reader = []; window.fig2 = new Figtank("ws://" + location.host + "/ws", {
  token: "READER", minDelay: 100, maxDelay: 200,
  onstate: (state, code) => window.reader.push(state + ":" + (code || ""))});
window.fig2.subscribe("secret", () => {}, {from: "earliest"});
"""


def test_a_refusal_stops_the_client(setup: Setup) -> None:
    """A page of another origin (localhost, the server 127.0.0.1) is refused the upgrade;
    the probe says 403 (its preflight for the token's header refused, it asks without
    the header), so the client stops. A reader attaching a topic it may not read
    is closed with 1008 and stops too. Neither comes back (100-200 ms backoff)."""
    page = setup.page
    page.get(f"http://localhost:{setup.port}/")
    before = len(setup.refused(403))
    closed_before = len(setup.served.events("websocket_closed"))
    page.execute_script(REFUSED.replace("PORT", str(setup.port)).replace("READER", READER))
    setup.until("return window.states.length > 0 && window.reader.length > 1")
    time.sleep(1.0)  # a client that retries would have come back a few times
    states, rejected, reader = page.execute_script(
        "return [window.states, window.rejected, window.reader]")
    assert states == ["refused:403"]
    assert rejected and "refused" in rejected[0]
    assert reader == ["open:", "refused:1008"]
    refused = setup.refused(403)[before:]
    assert len(refused) == 2  # the upgrade and the probe, once
    assert {e["error"] for e in refused} == {"origin_not_allowed"}
    closed = setup.served.events("websocket_closed")[closed_before:]
    assert [e["code"] for e in closed] == [1008]
