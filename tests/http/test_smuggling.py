"""Request smuggling and desync variants against a real ``figtank serve`` (its HTTP
listener over the embedded store), sent byte for byte over a raw loopback socket.

Each refused case hides a produce to a topic of its own after (or inside) a badly framed
request that a proxy in front could read differently. It must get one answer (the status
given, ``Connection: close``, the JSON error), one ``http_request_refused`` log line, then
the end of the connection, and neither the front request's topic nor the hidden one may
exist afterwards (asked on a fresh connection). Valid framing, pipelined, keeps working.
The core CL.TE case also runs over the Tank bridge and the Kafka upstream
(:func:`cl_te_refused_before_the_backend`, called from tests/http/test_backends.py with the
servers started there).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import trio

from gateway.http.framing import FramingGuard
from tests.serving import ServeProcess, figtank_serve

#: Seconds a socket operation may take (bounds every test).
TIMEOUT = 5.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    data = tmp_path_factory.mktemp("smuggling") / "data"
    with figtank_serve("--data-dir", str(data), "--durability", "os", "--http-listen",
                       "127.0.0.1:0", "--tank-listen", "", "--figg-listen", "",
                       "--metrics-listen", "") as served:
        yield served
        served.stop()


# ---------------------------------------------------------------------- the raw client

@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def exchange(where: tuple[str, int], data: bytes, *, pieces: int = 1) -> tuple[list[Response],
                                                                              bool]:
    """Send ``data`` (in ``pieces`` writes), read until the server closes or goes quiet:
    the responses, and whether the connection was closed (recv gave b"")."""
    with socket.create_connection(where, timeout=TIMEOUT) as sock:
        step = -(-len(data) // pieces)
        for start in range(0, len(data), step):
            sock.sendall(data[start:start + step])
            if pieces > 1:
                time.sleep(0.02)
        received = b""
        closed = False
        sock.settimeout(1.0)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                got = sock.recv(65536)
            except TimeoutError:
                break  # quiet: the connection stays open
            if not got:
                closed = True
                break
            received += got
    return parse_responses(received), closed


def parse_responses(data: bytes) -> list[Response]:
    responses = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"incomplete response head: {head!r}"
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        responses.append(Response(int(status_line.split()[1]), headers, data[:length]))
        data = data[length:]
    return responses


def get(where: tuple[str, int], target: str) -> Response:
    [answer], _ = exchange(where, f"GET {target} HTTP/1.1\r\nHost: t\r\n"
                           "Connection: close\r\n\r\n".encode())
    return answer


def produce(topic: str, body: bytes = b"EVIL!") -> bytes:
    """A whole, well framed produce request."""
    return (b"POST /topics/%s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
            % (topic.encode(), len(body), body))


def assert_absent(where: tuple[str, int], *topics: str) -> None:
    for topic in topics:
        answer = get(where, f"/topics/{topic}")
        assert answer.status == 404, (topic, answer)


def refused_lines(server: ServeProcess) -> int:
    """Refusals logged, less the 404s of :func:`assert_absent`."""
    return sum(line.get("status") != 404 for line in server.events("http_request_refused"))


def assert_refused(server: ServeProcess, data: bytes, status: int, *topics: str,
                   pieces: int = 1, before: int = 0) -> Response:
    """``data`` gets ``before`` good answers, then one refusal with ``status``, and the
    connection ends; nothing of ``topics`` exists; one more refusal is logged."""
    assert server.http is not None
    logged = refused_lines(server)
    responses, closed = exchange(server.http, data, pieces=pieces)
    assert [r.status for r in responses] == [200] * before + [status], responses
    refusal = responses[-1]
    assert refusal.headers.get("connection") == "close"
    assert set(refusal.json()) == {"error", "message"}
    assert closed, "the connection stayed open after the refusal"
    assert_absent(server.http, *topics)
    assert_logged(server, logged + 1)
    line = last_refusal(server)
    assert (line["status"], line["error"]) == (status, refusal.json()["error"])
    return refusal


def last_refusal(server: ServeProcess) -> dict:
    return [e for e in server.events("http_request_refused") if e.get("status") != 404][-1]


def assert_logged(server: ServeProcess, count: int) -> None:
    """``count`` refusals have been logged, no more (the log is read by another thread:
    wait for it)."""
    deadline = time.monotonic() + TIMEOUT
    while refused_lines(server) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert refused_lines(server) == count


# ---------------------------------------------------------------------- the corpus

HIDDEN = b"POST /topics/%s HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nEVIL!"


def front(topic: str, headers: bytes, body: bytes, line: bytes = b"") -> bytes:
    start = line or b"POST /topics/%s HTTP/1.1\r\n" % topic.encode()
    return start + b"Host: t\r\n" + headers + b"\r\n" + body


def cl_te(case: str, te_line: bytes) -> bytes:
    """CL.TE: a front end framing by Content-Length passes the hidden request inside the
    body; a back end honouring ``te_line`` ends the body at the 0 chunk."""
    body = b"0\r\n\r\n" + HIDDEN % f"s-{case}".encode()
    return front(f"f-{case}", b"Content-Length: %d\r\n%s\r\n" % (len(body), te_line), body)


def te_cl(case: str, te_line: bytes) -> bytes:
    """TE.CL: a front end reading chunks passes one chunk holding the hidden request; a
    back end framing by Content-Length: 4 stops after the chunk size and reads it."""
    hidden = HIDDEN % f"s-{case}".encode()
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(hidden), hidden)
    return front(f"f-{case}", b"%s\r\nContent-Length: 4\r\n" % te_line, body)


def te_only(case: str, te_line: bytes, chunks: bytes = b"5\r\nhello\r\n0\r\n\r\n") -> bytes:
    return front(f"f-{case}", te_line + b"\r\n", chunks) + HIDDEN % f"s-{case}".encode()


#: Transfer-Encoding lines a parser may take for ``chunked`` and another may not.
OBFUSCATED_TE = {
    "space-before-colon": b"Transfer-Encoding : chunked",
    "two-spaces": b"Transfer-Encoding:  chunked",
    "tab-before": b"Transfer-Encoding:\tchunked",
    "tab-after": b"Transfer-Encoding: chunked\t",
    "space-after": b"Transfer-Encoding: chunked ",
    "vertical-tab": b"Transfer-Encoding:\x0bchunked",
    "form-feed": b"Transfer-Encoding:\x0cchunked",
    "xchunked": b"Transfer-Encoding: xchunked",
    "chunked-x": b"Transfer-Encoding: chunkedx",
    "quoted": b'Transfer-Encoding: "chunked"',
    "parameter": b"Transfer-Encoding: chunked;q=1",
    "underscore": b"Transfer_Encoding: chunked",
    "nul-inside": b"Transfer-Encoding: chun\x00ked",
    "identity": b"Transfer-Encoding: identity",
    "chunked-then-identity": b"Transfer-Encoding: chunked, identity",
    "chunked-twice": b"Transfer-Encoding: chunked, chunked",
    "empty-element": b"Transfer-Encoding: chunked,",
    "two-lines": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: x",
    "two-lines-reversed": b"Transfer-Encoding: x\r\nTransfer-Encoding: chunked",
    "two-lines-same": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    "obs-fold-value": b"Transfer-Encoding:\r\n chunked",
    "obs-fold-line": b"X-Pad: y\r\n Transfer-Encoding: chunked",
    "bare-lf-end": b"Transfer-Encoding: chunked\n",
    "bare-cr-end": b"Transfer-Encoding: chunked\r",
    "no-colon": b"Transfer-Encoding chunked",
    "gzip-chunked": b"Transfer-Encoding: gzip, chunked",
}
#: Alone (no Content-Length), an unknown coding before a final chunked is 501.
TE_ALONE_STATUS = {"gzip-chunked": 501}


@pytest.mark.parametrize("name", sorted(OBFUSCATED_TE))
def test_cl_te_with_an_obfuscated_transfer_encoding_is_refused(server, name):
    assert_refused(server, cl_te(f"clte-{name}", OBFUSCATED_TE[name]), 400,
                   f"f-clte-{name}", f"s-clte-{name}")


@pytest.mark.parametrize("name", sorted(OBFUSCATED_TE))
def test_te_cl_with_an_obfuscated_transfer_encoding_is_refused(server, name):
    assert_refused(server, te_cl(f"tecl-{name}", OBFUSCATED_TE[name]), 400,
                   f"f-tecl-{name}", f"s-tecl-{name}")


@pytest.mark.parametrize("name", sorted(OBFUSCATED_TE))
def test_an_obfuscated_transfer_encoding_alone_is_refused(server, name):
    assert_refused(server, te_only(f"te-{name}", OBFUSCATED_TE[name]),
                   TE_ALONE_STATUS.get(name, 400), f"f-te-{name}", f"s-te-{name}")


@pytest.mark.parametrize("order", ["cl-first", "te-first"])
def test_content_length_with_transfer_encoding_is_refused_in_either_order(server, order):
    make = cl_te if order == "cl-first" else te_cl
    refusal = assert_refused(server, make(order, b"Transfer-Encoding: chunked"), 400,
                             f"f-{order}", f"s-{order}")
    assert refusal.json()["error"] == "malformed_request"
    assert "Content-Length and Transfer-Encoding" in refusal.json()["message"]
    line = last_refusal(server)
    assert (line["method"], line["path"]) == ("POST", f"/topics/f-{order}")


#: CL.CL and bad Content-Length values: the declared length of the front request.
CONTENT_LENGTHS = {
    "differing": b"Content-Length: 5\r\nContent-Length: 52",
    "differing-reversed": b"Content-Length: 52\r\nContent-Length: 5",
    "identical": b"Content-Length: 5\r\nContent-Length: 5",
    "list": b"Content-Length: 5, 5",
    "list-differing": b"Content-Length: 5, 52",
    "plus": b"Content-Length: +5",
    "minus": b"Content-Length: -1",
    "hex": b"Content-Length: 0x5",
    "space-inside": b"Content-Length: 5 2",
    "two-spaces": b"Content-Length:  5",
    "tab-after": b"Content-Length: 5\t",
    "space-before-colon": b"Content-Length : 5",
    "underscore": b"Content-Length: 5\r\nContent_Length: 52",
    "empty": b"Content-Length:",
    "exponent": b"Content-Length: 5e0",
    "huge": b"Content-Length: 99999999999999999999999",
}


@pytest.mark.parametrize("name", sorted(CONTENT_LENGTHS))
def test_bad_or_repeated_content_length_is_refused(server, name):
    case = f"cl-{name}"
    data = front(f"f-{case}", CONTENT_LENGTHS[name] + b"\r\n",
                 b"hello" + HIDDEN % f"s-{case}".encode())
    assert_refused(server, data, 400, f"f-{case}", f"s-{case}")


#: Chunked bodies a lenient parser reads another way; each hides a request after it.
CHUNKS = {
    "negative-size": b"-1\r\nhello\r\n0\r\n\r\n",
    "0x-prefix": b"0x5\r\nhello\r\n0\r\n\r\n",
    "space-before-crlf": b"5 \r\nhello\r\n0\r\n\r\n",
    "space-before-size": b" 5\r\nhello\r\n0\r\n\r\n",
    "tab-before-extension": b"5\t;a=b\r\nhello\r\n0\r\n\r\n",
    "space-before-extension": b"5 ;a=b\r\nhello\r\n0\r\n\r\n",
    "leading-zeros-overlong": b"00000000000000000005\r\nhello\r\n0\r\n\r\n",
    "overflow-17-digits": b"10000000000000005\r\nhello\r\n0\r\n\r\n",
    "overflow-wraps-to-5": b"ffffffffffffffff0000000000000005\r\nhello\r\n0\r\n\r\n",
    "empty-size": b"\r\nhello\r\n0\r\n\r\n",
    "size-too-small": b"3\r\nhello\r\n0\r\n\r\n",
    "size-too-large": b"8\r\nhello\r\n0\r\n\r\n",
    "no-crlf-after-data": b"5\r\nhello0\r\n\r\n",
    "lf-after-data": b"5\r\nhello\n0\r\n\r\n",
    "bare-lf-lines": b"5\nhello\n0\n\n",
    "bare-lf-size-line": b"5\nhello\r\n0\r\n\r\n",
    "bare-cr-size-line": b"5\rhello\r\n0\r\n\r\n",
    "extension-bare-lf": b"5;a\nb\r\nhello\r\n0\r\n\r\n",
    "extension-bare-cr": b"5;a\rb\r\nhello\r\n0\r\n\r\n",
    "extension-space": b"5;a=b c\r\nhello\r\n0\r\n\r\n",
    "extension-unclosed-quote": b'5;a="b\r\nhello\r\n0\r\n\r\n',
    "extension-very-long": b"5;" + b"a" * 5000 + b"\r\nhello\r\n0\r\n\r\n",
    "last-chunk-bare-lf": b"5\r\nhello\r\n0\n\r\n",
    "trailer-bare-lf": b"5\r\nhello\r\n0\r\nX-T: y\n\r\n",
    "trailer-obs-fold": b"5\r\nhello\r\n0\r\nX-T: y\r\n z\r\n\r\n",
    "trailer-content-length": b"5\r\nhello\r\n0\r\nContent-Length: 40\r\n\r\n",
    "trailer-bad-name": b"5\r\nhello\r\n0\r\nX T: y\r\n\r\n",
    "end-bare-lf": b"5\r\nhello\r\n0\r\n\n",
}


@pytest.mark.parametrize("name", sorted(CHUNKS))
def test_a_chunk_size_or_extension_trick_is_refused(server, name):
    case = f"ch-{name}"
    assert_refused(server, te_only(case, b"Transfer-Encoding: chunked", CHUNKS[name]), 400,
                   f"f-{case}", f"s-{case}")


def test_a_chunk_over_the_body_limit_is_413_before_its_data(server):
    data = te_only("ch-huge", b"Transfer-Encoding: chunked",
                   b"ffffffffffffffff\r\nhello\r\n0\r\n\r\n")
    refusal = assert_refused(server, data, 413, "f-ch-huge", "s-ch-huge")
    assert refusal.json()["error"] == "body_too_large"


#: Heads broken in ways lenient parsers forgive: (head lines after the request line,
#: the request line, the status).
HEADS = {
    "bare-lf-request-line": (b"Host: t\r\n", b"POST /topics/{f} HTTP/1.1\n", 400),
    "bare-lf-header": (b"Host: t\nX-A: b\r\n", None, 400),
    "bare-lf-end-of-head": (b"Host: t\r\n\n", None, 400),
    "all-bare-lf": (b"Host: t\n\n", b"POST /topics/{f} HTTP/1.1\n", 400),
    "bare-cr-header": (b"Host: t\r\nX-A: b\rX-B: c\r\n", None, 400),
    "bare-cr-line-end": (b"Host: t\r\r\n", None, 400),
    "obs-fold": (b"Host: t\r\nX-A: b\r\n c\r\n", None, 400),
    "obs-fold-tab": (b"Host: t\r\nX-A: b\r\n\tc\r\n", None, 400),
    "whitespace-before-first-header": (b" Host: t\r\n", None, 400),
    "space-in-name": (b"Host: t\r\nX A: b\r\n", None, 400),
    "space-before-colon": (b"Host: t\r\nX-A : b\r\n", None, 400),
    "empty-name": (b"Host: t\r\n: b\r\n", None, 400),
    "non-token-name": (b"Host: t\r\nX(A): b\r\n", None, 400),
    "non-ascii-name": (b"Host: t\r\nX-\xe9: b\r\n", None, 400),
    "no-colon": (b"Host: t\r\nX-A b\r\n", None, 400),
    "nul-in-value": (b"Host: t\r\nX-A: a\x00b\r\n", None, 400),
    "control-in-value": (b"Host: t\r\nX-A: a\x01b\r\n", None, 400),
    "escape-in-value": (b"Host: t\r\nX-A: a\x1bb\r\n", None, 400),
    "del-in-value": (b"Host: t\r\nX-A: a\x7fb\r\n", None, 400),
    "header-line-too-long": (b"Host: t\r\nX-A: " + b"a" * 9000 + b"\r\n", None, 431),
    "head-too-long": (b"Host: t\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000)
                                                 for i in range(20)), None, 431),
    "too-many-headers": (b"Host: t\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(101)),
                         None, 431),
    "request-line-too-long": (b"Host: t\r\n", b"POST /topics/{f}?" + b"a" * 9000
                              + b" HTTP/1.1\r\n", 414),
    "http10-with-te": (b"Host: t\r\nTransfer-Encoding: chunked\r\n",
                         b"POST /topics/{f} HTTP/1.0\r\n", 400),
    "http-2": (b"Host: t\r\n", b"POST /topics/{f} HTTP/2.0\r\n", 505),
    "version-lowercase": (b"Host: t\r\n", b"POST /topics/{f} http/1.1\r\n", 400),
    "two-spaces-in-request-line": (b"Host: t\r\n", b"POST  /topics/{f} HTTP/1.1\r\n", 400),
    "space-after-version": (b"Host: t\r\n", b"POST /topics/{f} HTTP/1.1 \r\n", 400),
    "tab-in-request-line": (b"Host: t\r\n", b"POST\t/topics/{f} HTTP/1.1\r\n", 400),
    "absolute-form-other-host": (b"Host: t\r\n",
                                 b"POST http://elsewhere/topics/{f} HTTP/1.1\r\n", 400),
    "authority-form": (b"Host: t\r\n", b"CONNECT t:80 HTTP/1.1\r\n", 400),
    "target-without-slash": (b"Host: t\r\n", b"POST topics/{f} HTTP/1.1\r\n", 400),
    "host-missing": (b"", None, 400),
    "host-twice": (b"Host: t\r\nHost: u\r\n", None, 400),
    "empty-line-before-request": (b"Host: t\r\n", b"\r\nPOST /topics/{f} HTTP/1.1\r\n", 400),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_malformed_head_is_refused(server, name):
    case = f"hd-{name}"
    fields, line, status = HEADS[name]
    line = (line or b"POST /topics/{f} HTTP/1.1\r\n").replace(b"{f}", f"f-{case}".encode())
    body = b"hello"
    data = line + fields + b"Content-Length: 5\r\n\r\n" + body + HIDDEN % f"s-{case}".encode()
    refusal = assert_refused(server, data, status, f"f-{case}", f"s-{case}")
    if name == "http10-with-te":  # with a Content-Length too: refused for the version
        assert "HTTP/1.0" in refusal.json()["message"]


def test_a_head_sent_byte_by_byte_is_judged_the_same(server):
    """Bare LF split across writes: the fault is found however the bytes arrive."""
    data = cl_te("slow-clte", b"Transfer-Encoding: chunked")
    assert_refused(server, data, 400, "f-slow-clte", "s-slow-clte", pieces=12)
    data = te_only("slow-lf", b"Transfer-Encoding: chunked", b"5\nhello\r\n0\r\n\r\n")
    assert_refused(server, data, 400, "f-slow-lf", "s-slow-lf", pieces=12)


TOPIC = b"/topics/valid-pipe"
#: Framing every legitimate client uses (and some it may), pipelined.
VALID_PIPELINE = (
    produce("valid-pipe", b"one")
    + b"POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      b"3;name=value;q=\"x y\"\r\ntwo\r\n0\r\n\r\n" % TOPIC
    + b"POST %s HTTP/1.1\r\nhost: t\r\nTRANSFER-ENCODING: CHUNKED\r\n\r\n"
      b"2\r\nth\r\n000003\r\nree\r\n0\r\nX-Trailer: ok\r\n\r\n" % TOPIC
    + b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length:4\r\nX-Tab:\tv a l \t\r\n"
      b"X-Obs-Text: caf\xe9\r\n\r\nfour" % TOPIC
    + b"POST http://t%s HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nfive" % TOPIC
    + b"GET %s/partitions/0/messages?offset=1 HTTP/1.1\r\nHost: t\r\n"
      b"Content-Length: 0\r\n\r\n" % TOPIC
)


def corpus() -> dict[str, bytes]:
    """Every request of the corpus above, by name."""
    cases = {}
    for name, line in OBFUSCATED_TE.items():
        cases[f"clte-{name}"] = cl_te(name, line)
        cases[f"tecl-{name}"] = te_cl(name, line)
        cases[f"te-{name}"] = te_only(name, line)
    for name, value in CONTENT_LENGTHS.items():
        cases[f"cl-{name}"] = front("f", value + b"\r\n", b"hello")
    for name, chunks in CHUNKS.items():
        cases[f"ch-{name}"] = te_only(name, b"Transfer-Encoding: chunked", chunks)
    for name, (fields, line, _) in HEADS.items():
        cases[f"hd-{name}"] = ((line or b"POST /topics/{f} HTTP/1.1\r\n") + fields
                               + b"Content-Length: 5\r\n\r\nhello")
    cases["valid"] = VALID_PIPELINE
    return cases


@pytest.mark.parametrize(("name", "data"), sorted(corpus().items()))
def test_the_guard_judges_the_same_however_the_bytes_arrive(name, data):
    """All at once (a whole head checked in one go), byte by byte (line by line) and in
    uneven pieces: the same fault, and the same bytes handed on before it."""
    outcomes = set()
    for size in (len(data), 1, 7, 100):
        guard = FramingGuard(1024 * 1024)
        passed = b"".join(guard.feed(data[i:i + size]) for i in range(0, len(data), size))
        error = guard.error
        outcomes.add((passed, error and (error.status, error.code, error.message)))
    assert len(outcomes) == 1, outcomes


# ---------------------------------------------------------------------- pipelines

def test_requests_pipelined_before_an_error_are_served_and_none_after(server):
    """Good, bad (bare LF), good in one write: the first is appended and answered, the
    second refused, the third never executed."""
    assert server.http is not None
    bad = b"POST /topics/pl-bad HTTP/1.1\nHost: t\r\nContent-Length: 5\r\n\r\nEVIL!"
    data = produce("pl-first", b"first") + bad + produce("pl-after")
    refusal = assert_refused(server, data, 400, "pl-bad", "pl-after", before=1)
    assert "bare LF" in refusal.json()["message"]
    line = last_refusal(server)
    assert (line["method"], line["path"]) == ("?", "?")  # its request line was the fault
    fetched = get(server.http, "/topics/pl-first/partitions/0/messages?offset=1").json()
    assert [m["value"] for m in fetched["messages"]] == ["first"]


def test_nothing_after_a_chunked_body_error_is_executed(server):
    """The refused request's own body breaks off mid-way: its chunks before the fault are
    not appended, and the request after it is not executed."""
    data = te_only("pl-mid", b"Transfer-Encoding: chunked",
                   b"5\r\nhello\r\n5\r\nworld\r\nzz\r\n0\r\n\r\n")
    assert_refused(server, data, 400, "f-pl-mid", "s-pl-mid")


def test_bytes_after_an_upgrade_not_taken_are_never_parsed_as_http(server):
    """A request proposing another protocol is answered as usual, and what came after it
    (a CL.TE request here) is the other protocol's: the connection ends unparsed."""
    assert server.http is not None
    proposal = (b"GET /topics HTTP/1.1\r\nHost: t\r\nUpgrade: foo/1\r\n"
                b"Connection: Upgrade\r\n\r\n")
    responses, closed = exchange(server.http, proposal + cl_te(
        "up", b"Transfer-Encoding: chunked"))
    assert [r.status for r in responses] == [200] and closed
    assert_absent(server.http, "f-up", "s-up")
    # Without bytes after it, the connection goes on.
    responses, closed = exchange(server.http, proposal)
    assert [r.status for r in responses] == [200] and not closed


def test_a_valid_keep_alive_pipeline_is_served_in_full(server):
    """Framing every legitimate client uses, pipelined in one write: all served, in order,
    on one connection that stays open."""
    assert server.http is not None
    data = VALID_PIPELINE
    responses, closed = exchange(server.http, data)
    assert [r.status for r in responses] == [200] * 6, responses
    assert not closed
    assert [o["offsets"][0]["offset"] for o in map(Response.json, responses[:5])] == [
        1, 2, 3, 4, 5]
    assert [m["value"] for m in responses[5].json()["messages"]] == [
        "one", "two", "three", "four", "five"]
    # HTTP/1.0, answered and closed as 1.0 wants.
    responses, closed = exchange(server.http, b"GET /topics/valid-pipe HTTP/1.0\r\n\r\n")
    assert [r.status for r in responses] == [200] and closed


# ---------------------------------------------------------------------- curl

def curl(*args: str) -> tuple[int, str]:
    result = subprocess.run(["curl", "-sS", "--max-time", str(TIMEOUT), "-w", "\n%{http_code}",
                             *args], capture_output=True, timeout=TIMEOUT * 2, check=False)
    body, _, status = result.stdout.decode().rpartition("\n")
    return int(status), body


def test_curl_sending_content_length_with_chunked_is_refused(server):
    """curl sends both headers when told to (and then chunks the body): refused."""
    assert server.http is not None
    host, port = server.http
    base = f"http://{host}:{port}"
    logged = refused_lines(server)
    status, body = curl("-H", "Content-Length: 80", "-H", "Transfer-Encoding: chunked",
                        "--data-binary", "hello", f"{base}/topics/curl-clte")
    assert status == 400, body
    assert "Content-Length and Transfer-Encoding" in json.loads(body)["message"]
    assert_absent(server.http, "curl-clte")
    # A chunked upload as curl makes it is served.
    status, body = curl("-H", "Transfer-Encoding: chunked", "--data-binary", "hello",
                        f"{base}/topics/curl-chunked")
    assert status == 200, body
    assert json.loads(body)["offsets"] == [{"partition": 0, "offset": 1}]
    assert_logged(server, logged + 1)


# ---------------------------------------------------------------------- other backends

async def cl_te_refused_before_the_backend(where: tuple[str, int]) -> None:
    """The core CL.TE case against a gateway over another backend, then a fetch on a
    fresh connection: neither topic was created upstream."""
    responses, closed = await trio.to_thread.run_sync(
        exchange, where, cl_te("backend", b"Transfer-Encoding: chunked"))
    assert [r.status for r in responses] == [400] and closed
    assert responses[0].headers["connection"] == "close"
    for topic in ("f-backend", "s-backend"):
        answer = await trio.to_thread.run_sync(get, where, f"/topics/{topic}")
        assert answer.status == 404, answer
    [ok], _ = await trio.to_thread.run_sync(exchange, where, produce("backend-ok", b"ok"))
    assert ok.status == 200  # the backend serves the next client
