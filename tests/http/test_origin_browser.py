"""A page of another origin in headless Chromium: with ``http.cors_origins`` empty its
``fetch(..., {mode: "no-cors"})`` POST, its form POST and its WebSocket publish append
nothing; with its origin listed, all three land, and a CORS fetch with the documented
``Figtank-Key-Base64`` header passes its preflight. The page comes from a second real
server (``http.server`` on another loopback port and host name: a cross-site origin)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import trio

from tests.http.browser import chromium
from tests.http.helpers import H11Client, http_server

PAGE = b"""<!doctype html><html><body>
<iframe name="sink"></iframe>
<form id="form" method="POST" enctype="text/plain" target="sink">
<input name="v" value="form"></form></body></html>"""

#: Run in the page: every way a page writes, each one's outcome (``arguments[0]``: the
#: figtank base URL; the last argument: selenium's callback).
WRITES = """
const base = arguments[0], done = arguments[arguments.length - 1];
const out = {};
const settle = (p, ms) => Promise.race([p, new Promise((r) => setTimeout(() => r("timeout"), ms))]);
(async () => {
  out.nocors = await fetch(base + "/topics/b", {method: "POST", mode: "no-cors",
    body: "nocors"}).then((r) => r.type, (e) => "error: " + e);
  out.cors = await fetch(base + "/topics/b", {method: "POST",
    headers: {"Figtank-Key-Base64": btoa("k1"), "Content-Type": "text/plain"},
    body: "keyed"}).then(async (r) => r.status + " " + (await r.text()), (e) => "error: " + e);
  const form = document.getElementById("form");
  form.action = base + "/topics/b";
  out.form = await settle(new Promise((resolve) => {
    document.querySelector("iframe").onload = () => resolve("loaded");
    form.submit();
  }), 5000);
  out.ws = await settle(new Promise((resolve) => {
    const ws = new WebSocket(base.replace("http", "ws") + "/ws");
    ws.onmessage = (e) => {
      const m = JSON.parse(e.data);
      const publish = {op: "publish", topic: "b", value: "ws", id: 1};
      if (m.op === "hello") ws.send(JSON.stringify(publish));
      if (m.op === "ack") { ws.close(); resolve("ack"); }
    };
    ws.onclose = (e) => resolve("closed " + e.code);
  }), 5000);
  done(out);
})();
"""


@contextmanager
def page_server() -> Iterator[str]:
    """A second origin serving :data:`PAGE`: yields its origin (``http://localhost:P``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def _messages(host: str, port: int) -> list[dict]:
    client = await H11Client.connect(host, port)
    status, _, body = await client.request("GET", "/topics/b/partitions/0/messages")
    await client.aclose()
    return [] if status == 404 else body["messages"]


async def test_a_foreign_page_appends_nothing_and_a_listed_one_does(tmp_path):
    with page_server() as origin, chromium(tmp_path / "profile") as driver:
        driver.set_script_timeout(30)
        await trio.to_thread.run_sync(driver.get, f"{origin}/")

        async def writes(base: str) -> dict:
            with trio.fail_after(40):
                return await trio.to_thread.run_sync(driver.execute_async_script, WRITES,
                                                     base)

        async with http_server(tmp_path / "alone") as server:
            out = await writes(f"http://{server.host}:{server.port}")
            # The browser sent it (an opaque answer), the listener refused it.
            assert out["nocors"] == "opaque", out
            assert out["cors"].startswith("error"), out  # the preflight is refused
            assert out["form"] == "loaded" and out["ws"].startswith("closed"), out
            assert await _messages(server.host, server.port) == []

        async with http_server(tmp_path / "listed", http_cors_origins=(origin,)) as server:
            out = await writes(f"http://{server.host}:{server.port}")
            assert out["nocors"] == "opaque" and out["form"] == "loaded", out
            assert out["ws"] == "ack", out
            status, _, answer = out["cors"].partition(" ")
            assert status == "200" and json.loads(answer)["topic"] == "b", out
            got = await _messages(server.host, server.port)
            assert [(m.get("key"), m["value"].strip()) for m in got] == [
                (None, "nocors"), ("k1", "keyed"), (None, "v=form"), (None, "ws")]
