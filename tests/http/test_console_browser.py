"""The console as a user keeps it open, in a real headless Chromium against ``figtank
serve`` (a subprocess, under an access policy, nothing scraping ``/metrics``): its rates
move while a producer runs; its message browser pages a partition forward and back from
an offset or a time and shows a payload as text, JSON or hex; its produce form answers
the offset; a refused call shows the server's message. One server and one browser for the
module; screenshots go to the test's tmp dir (printed)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.support.ui import WebDriverWait

from tests.http.access_helpers import READER, WRITER, policy
from tests.http.browser import chromium, screenshot
from tests.serving import ServeProcess, figtank_serve


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("console")
    access = tmp / "access.toml"
    access.write_text(policy('["news"]'))
    with figtank_serve("--data-dir", str(tmp / "data"), "--durability", "os",
                       "--tank-listen", "", "--figg-listen", "", "--kafka-listen", "",
                       "--metrics-listen", "", "--http-listen", "127.0.0.1:0",
                       "--policy-file", str(access)) as process:
        yield process


@pytest.fixture(scope="module")
def base(served: ServeProcess) -> str:
    assert served.http
    host, port = served.http
    return f"http://{host}:{port}"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with chromium(tmp_path_factory.mktemp("profile")) as driver:
        yield driver


def _request(base: str, method: str, path: str, body: bytes | None = None,
             token: str | None = WRITER, headers: dict[str, str] | None = None
             ) -> tuple[int, dict[str, Any]]:
    all_headers = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(base + path, data=body, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def _produce(base: str, topic: str, values: list[str], key: str | None = None) -> None:
    lines = [json.dumps({"value": v, **({"key": key} if key else {})}) for v in values]
    status, body = _request(base, "POST", f"/topics/{topic}", "\n".join(lines).encode(),
                            headers={"Content-Type": "application/x-ndjson"})
    assert status == 200, body


def _open(page: Any, base: str, token: str) -> None:
    """The console, fresh, with ``token`` pasted in its token field."""
    page.get(base + "/")
    page.execute_script("const t = document.getElementById('token'); t.value = arguments[0];"
                        "t.dispatchEvent(new Event('change'))", token)


def _js(page: Any, script: str, *args: Any) -> Any:
    return page.execute_script(script, *args)


def _until(page: Any, script: str, *args: Any, timeout: float = 10) -> Any:
    """Wait until ``script`` returns something truthy; that."""
    return WebDriverWait(page, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script(script, *args))


FILL = """for (const [id, value] of Object.entries(arguments[0])) {
  document.getElementById(id).value = value;
}"""
SUBMIT = "document.getElementById(arguments[0]).requestSubmit()"
RANGE = "return document.getElementById('b-range').textContent"
ROWS = """return Array.from(document.getElementById('messages').tBodies[0].rows,
  (r) => Array.from(r.cells, (c) => c.innerText))"""


def _browse(page: Any, fields: dict[str, str], expected_range: str) -> list[list[str]]:
    _js(page, FILL, fields)
    _js(page, SUBMIT, "browse")
    return _page_shows(page, expected_range)


def _page_shows(page: Any, expected_range: str) -> list[list[str]]:
    try:
        _until(page, RANGE + " === arguments[0]", expected_range)
    except TimeoutException:
        shown = _js(page, RANGE + " + ' / ' + document.getElementById('b-error').textContent")
        raise AssertionError(f"the browser shows {shown!r}, not {expected_range!r}") from None
    return _js(page, ROWS)


def _click(page: Any, element_id: str, expected_range: str) -> list[list[str]]:
    _js(page, "document.getElementById(arguments[0]).click()", element_id)
    return _page_shows(page, expected_range)


def _disabled(page: Any) -> tuple[bool, bool]:
    return tuple(_js(page, "return ['b-back', 'b-forward'].map("
                           "(id) => document.getElementById(id).disabled)"))


def test_browse_pages_forward_and_back_and_switches_views(browser, base, tmp_path):
    _produce(base, "orders", [json.dumps({"n": i, "name": f"order {i}"}) for i in range(1, 31)],
             key="customer-7")
    _open(browser, base, WRITER)
    rows = _browse(browser, {"b-topic": "orders", "b-partition": "0", "b-offset": "1",
                             "b-time": "", "b-size": "10"}, "offsets 1-10 of 1-30")
    assert [row[0] for row in rows] == [str(n) for n in range(1, 11)]
    _, when, key, headers, payload = rows[0]
    assert (key, headers, payload) == ("customer-7", "none", '{"n": 1, "name": "order 1"}')
    assert abs(datetime.fromisoformat(when).timestamp() - time.time()) < 60
    assert _disabled(browser) == (True, False)

    assert _click(browser, "b-forward", "offsets 11-20 of 1-30")[0][0] == "11"
    rows = _click(browser, "b-forward", "offsets 21-30 of 1-30")
    assert [r[0] for r in rows] == [str(n) for n in range(21, 31)]
    assert _disabled(browser) == (False, True)  # the end: nothing forward
    assert _click(browser, "b-back", "offsets 11-20 of 1-30")[0][0] == "11"
    assert _click(browser, "b-back", "offsets 1-10 of 1-30")[0][0] == "1"
    assert _disabled(browser) == (True, False)
    # Back from offset 5 stops at the first offset.
    _browse(browser, {"b-offset": "5"}, "offsets 5-14 of 1-30")
    assert _click(browser, "b-back", "offsets 1-10 of 1-30")[0][0] == "1"

    payloads = "return Array.from(document.querySelectorAll('#messages pre'), (p) => p.textContent)"
    _js(browser, "document.querySelector('input[name=view][value=json]').click()")
    shown = _js(browser, payloads)
    assert shown[0] == '{\n  "n": 1,\n  "name": "order 1"\n}'
    _js(browser, "document.querySelector('input[name=view][value=hex]').click()")
    shown = _js(browser, payloads)
    assert shown[0].splitlines()[0] == (
        "0000  7b 22 6e 22 3a 20 31 2c 20 22 6e 61 6d 65 22 3a  {\"n\": 1, \"name\":")
    assert shown[0].splitlines()[1].startswith("0010  20 22 6f 72 64 65 72 20 31 22 7d")
    _js(browser, "document.getElementById('topics').scrollIntoView()")
    screenshot(browser, tmp_path / "console-browser.png")
    screenshot(browser, Path("/tmp/console.png"))
    _js(browser, "document.querySelector('input[name=view][value=text]').click()")
    assert _js(browser, payloads)[0] == '{"n": 1, "name": "order 1"}'


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def test_browse_from_a_time_typed_or_picked(browser, base):
    _produce(base, "timed", ["early 1", "early 2", "early 3"])
    time.sleep(0.05)
    cut = _now_ms()
    time.sleep(0.05)
    _produce(base, "timed", ["late 1", "late 2"])
    _open(browser, base, WRITER)
    iso = datetime.fromtimestamp(cut / 1000, UTC).isoformat(timespec="milliseconds")
    rows = _browse(browser, {"b-topic": "timed", "b-partition": "0", "b-size": "10",
                             "b-time": iso.replace("+00:00", "Z")}, "offsets 4-5 of 1-5")
    assert [(r[0], r[4]) for r in rows] == [("4", "late 1"), ("5", "late 2")]
    assert _js(browser, "return document.getElementById('b-offset').value") == "4"
    assert _disabled(browser) == (False, True)
    assert _click(browser, "b-back", "offsets 1-5 of 1-5")[0][4] == "early 1"

    # The datetime-local picker: local time, no zone.
    local = datetime.fromtimestamp(cut / 1000).isoformat(timespec="milliseconds")
    _js(browser, "const p = document.getElementById('b-pick'); p.value = arguments[0];"
                 "p.dispatchEvent(new Event('change'))", local)
    picked = _js(browser, "return document.getElementById('b-time').value")
    assert datetime.fromisoformat(picked) == datetime.fromisoformat(local)  # "16.03" or "16.030"
    _js(browser, SUBMIT, "browse")
    assert _page_shows(browser, "offsets 4-5 of 1-5")[0][4] == "late 1"
    # After the last message: an empty page that says so.
    _browse(browser, {"b-time": "2999-01-01T00:00:00Z"}, "no messages from offset 6 "
            "(last offset 5)")
    assert _js(browser, ROWS) == []


RESULT = "return document.getElementById('p-result')"


def test_produce_form_shows_the_offset_or_the_error(browser, base):
    _open(browser, base, WRITER)
    _js(browser, FILL, {"p-topic": "made-in-form", "p-partition": "", "p-key": "ключ-1",
                        "p-value": "hello from the form"})
    _js(browser, SUBMIT, "produce")
    _until(browser, RESULT + ".textContent.startsWith('appended')")
    assert _js(browser, RESULT + ".textContent") == (
        "appended to made-in-form partition 0 at offset 1")
    status, body = _request(base, "GET", "/topics/made-in-form/partitions/0/messages")
    assert [(m["key"], m["value"]) for m in body["messages"]] == [
        ("ключ-1", "hello from the form")]
    rows = _browse(browser, {"b-topic": "made-in-form", "b-partition": "0", "b-offset": "1",
                             "b-time": ""}, "offsets 1-1 of 1-1")
    assert [(r[2], r[4]) for r in rows] == [("ключ-1", "hello from the form")]

    _js(browser, FILL, {"p-partition": "3"})
    _js(browser, SUBMIT, "produce")
    _until(browser, RESULT + ".className === 'error'")
    status, body = _request(base, "POST", "/topics/made-in-form?partition=3", b"x")
    assert status >= 400
    assert _js(browser, RESULT + ".textContent") == f"404 {body['error']}: {body['message']}"


def test_a_refused_call_shows_the_servers_message(browser, base, tmp_path):
    _produce(base, "private", ["secret"])
    for token in (READER, ""):  # may subscribe to "news" only; none at all
        _open(browser, base, token)
        status, body = _request(base, "GET", "/topics/private/partitions/0/messages?"
                                "max_count=10&offset=1", token=token or None)
        assert status in (401, 403, 404), body
        _js(browser, FILL, {"b-topic": "private", "b-partition": "0", "b-offset": "1",
                            "b-time": "", "b-size": "10"})
        _js(browser, SUBMIT, "browse")
        shown = _until(browser, "return document.getElementById('b-error').textContent")
        assert shown == f"{status} {body['error']}: {body['message']}"
        assert _js(browser, ROWS) == [] and _disabled(browser) == (True, True)

        _js(browser, FILL, {"p-topic": "private", "p-partition": "", "p-key": "",
                            "p-value": "not allowed"})
        _js(browser, SUBMIT, "produce")
        _until(browser, RESULT + ".className === 'error'")
        status, body = _request(base, "POST", "/topics/private", b"x", token=token or None)
        assert status in (401, 403), body
        assert _js(browser, RESULT + ".textContent") == (
            f"{status} {body['error']}: {body['message']}")
    _js(browser, "document.getElementById('browse-section').scrollIntoView()")
    screenshot(browser, tmp_path / "console-refused.png")
    status, body = _request(base, "GET", "/topics/private/partitions/0/messages")
    assert [m["value"] for m in body["messages"]] == ["secret"]  # nothing appended


def test_rates_move_while_a_producer_runs_with_nothing_scraping(browser, base, tmp_path):
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            _request(base, "POST", "/topics/steady", b"tick")
            time.sleep(0.01)

    _open(browser, base, WRITER)
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        now = _until(browser, """const text = document.getElementById('rate-now').textContent;
            const m = /now: ([0-9.]+) published/.exec(text);
            return m && parseFloat(m[1]) > 0 && text""")
        topic_rate = _until(browser, """for (const row of document.getElementById('topics').rows) {
            if (row.cells[0].textContent === 'steady' && parseFloat(row.cells[4].textContent) > 0)
              return row.cells[4].textContent;
          }""")
    finally:
        stop.set()
        producer.join(10)
    assert float(now.split()[1]) > 0 and float(topic_rate) > 0
    screenshot(browser, tmp_path / "console-rates.png")


def test_browse_button_in_the_topics_table_and_a_binary_payload(browser, base):
    lines = b'{"value":"a"}\n{"key_base64":"/w==","value_base64":"AAH/"}\n'
    status, body = _request(base, "POST", "/topics/listed", lines,
                            headers={"Content-Type": "application/x-ndjson"})
    assert status == 200, body
    _open(browser, base, WRITER)
    button = "document.querySelector('button[data-browse=\"listed/0\"]')"
    _until(browser, f"return {button}")
    _js(browser, f"{button}.click()")
    rows = _page_shows(browser, "offsets 1-2 of 1-2")
    assert [(r[2], r[4]) for r in rows] == [
        ("—", "a"), ("base64:/w==", "(not UTF-8 text: 3 bytes; see hex)")]
    _js(browser, "document.querySelector('input[name=view][value=hex]').click()")
    assert _js(browser, ROWS)[1][4] == "0000  " + "00 01 ff".ljust(47) + "  ..."
    _js(browser, "document.querySelector('input[name=view][value=text]').click()")
