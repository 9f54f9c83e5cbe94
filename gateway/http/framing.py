"""Strict HTTP/1.1 request framing (RFC 9112), checked before h11 sees a byte.

h11 is lenient where leniency lets a request be smuggled past a proxy that reads the bytes
differently: it takes ``Content-Length`` together with ``Transfer-Encoding`` (and reads the
chunked body), bare LF line ends, obs-fold, control characters in values, over-long chunk
sizes and bare LF in chunk lines and trailers. :class:`FramingGuard` sits between the
socket and h11: every byte received is checked first, and only the bytes of messages (or
parts of messages) found well framed are handed on. A fault found is kept as
:attr:`FramingGuard.error` and raised by the session once h11 has used up every byte
before it, so requests pipelined before a bad one are served, the bad one is refused
(``Connection: close``) and nothing after it is ever parsed.

What is refused, and with which status, is listed in docs/http.md ("Request framing").
Decisions beyond the RFC's MUSTs:

- Any second ``Content-Length`` (a second line, or a list ``5, 5``) is refused, identical
  or not, and so is any second ``Transfer-Encoding`` line.
- ``Content-Length`` and ``Transfer-Encoding`` values take at most one SP after the colon
  and no whitespace after the value: every client sends them so, and a tab or extra space
  is how a value is hidden from one parser and not another.
- A name that reads as ``Content-Length`` or ``Transfer-Encoding`` with ``_`` for ``-`` is
  refused: some servers and gateways (CGI) fold the two together.
- A transfer coding list whose last coding is not ``chunked``, or with ``chunked`` twice,
  is 400 (the length cannot be known, §6.3); another coding before a final ``chunked``
  is 501 (§6.1: not implemented).
- Chunk lines carry no whitespace; a chunk size has at most 16 hex digits and is refused
  with 413 when over the body limit; a chunk line with its extensions is at most
  :data:`MAX_CHUNK_LINE` bytes.
- An absolute-form target is served as its origin form when its authority is the
  ``Host`` (RFC 9112 §3.2.2 wants it accepted); another authority, the authority form and
  the asterisk form (but for ``OPTIONS *``) are 400.

After a request with an ``Upgrade`` header, the bytes that follow belong to the protocol
the client proposed and pass unchecked until the answer is known: when the server does
not switch, :meth:`FramingGuard.next_cycle` says whether anything passed unchecked, and
then the connection ends instead of parsing it as HTTP.
"""

from __future__ import annotations

import re
from typing import Final

from gateway.http.request import HttpError

#: The request line, a header line, the whole head, the number of header lines.
MAX_REQUEST_LINE: Final = 8 * 1024
MAX_FIELD_LINE: Final = 8 * 1024
MAX_HEAD: Final = 16 * 1024
MAX_FIELDS: Final = 100
#: A chunk-size line with its extensions.
MAX_CHUNK_LINE: Final = 1024

_TCHAR = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]"
_REQUEST_LINE = re.compile(rb"(" + _TCHAR + rb"+) ([\x21-\x7e]+) HTTP/([0-9])\.([0-9])\r\n")
#: name ":" OWS value OWS, value of VCHAR / obs-text with inner SP and HTAB.
_VISIBLE = rb"[\x21-\x7e\x80-\xff]+"
_FIELD_LINE = re.compile(rb"(" + _TCHAR + rb"+):[ \t]*((?:" + _VISIBLE + rb"(?:[ \t]+" + _VISIBLE
                         + rb")*)?)[ \t]*\r\n")
#: A framing field's value: one optional SP before it, nothing after.
_STRICT_VALUE = re.compile(rb":[ ]?[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?\r\n")
_TOKEN = re.compile(_TCHAR + rb"+")
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]+)((?:;" + _TCHAR + rb"+(?:=(?:" + _TCHAR + rb"+|"
                         + _QUOTED + rb"))?)*)\r\n")
_ABSOLUTE = re.compile(rb"(?i:https?)://([^/?#]*)([^#]*)")
_FRAMING_NAMES: Final = frozenset({b"content-length", b"transfer-encoding"})

# States of the reader.
_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UPGRADED = range(7)


def _bad(message: str) -> HttpError:
    return HttpError(400, "malformed_request", message)


def _too_large(message: str) -> HttpError:
    return HttpError(431, "header_too_large", message)


class FramingGuard:
    """Checks one connection's request bytes as they arrive (see the module doc)."""

    __slots__ = ("_buf", "_fields", "_head", "_head_size", "_max_body", "_passed", "_pos",
                 "_remaining", "_request", "_state", "_upgrade", "error")

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        #: The first fault found; nothing from it on is handed on.
        self.error: HttpError | None = None
        self._buf = b""
        self._pos = 0
        self._state = _HEAD
        self._head: list[bytes] = []
        self._head_size = 0
        self._request: tuple[bytes, bytes, bytes] | None = None
        self._fields: list[tuple[bytes, bytes, bytes]] = []
        self._remaining = 0
        self._upgrade = False
        self._passed = 0

    @property
    def holding(self) -> bool:
        """True when bytes of a request are held back (an incomplete line) or a fault
        waits to be raised: the next request has begun."""
        return bool(self._buf) or self.error is not None

    @property
    def request_line(self) -> tuple[str, str] | None:
        """Method and path of the request whose head is being read (None before its
        request line), for the log line of a refusal."""
        if self._request is None:
            return None
        method, target, _ = self._request
        return method.decode("latin-1"), target.decode("latin-1").partition("?")[0]

    def feed(self, data: bytes | bytearray) -> bytes | bytearray:
        """Check ``data`` (more bytes from the client); returns the bytes found well
        framed so far, for h11. A fault is kept in :attr:`error`."""
        if self.error is not None:
            return b""
        if self._state == _UPGRADED:
            self._passed += len(data)
            return data
        if self._state == _BODY and not self._buf and len(data) < self._remaining:
            self._remaining -= len(data)  # the common case: a body passing through
            return data
        self._buf += data
        out: list[bytes] = []
        try:
            self._run(out)
        except HttpError as error:
            self.error = error
            self._buf = b""
        return b"".join(out)

    def next_cycle(self) -> bool:
        """The answer to the request is sent and the connection would go on: False when
        bytes after an upgrade proposal were handed on unchecked (the connection must
        end), else True, ready for the next request."""
        if self._state == _UPGRADED:
            if self._passed:
                return False
            self._state = _HEAD
            self._upgrade = False
        return True

    # ---------------------------------------------------------------------- reading

    def _run(self, out: list[bytes]) -> None:
        """Takes what it can off the buffer (``_pos`` moves on), then drops it."""
        self._pos = 0
        try:
            while self._pos < len(self._buf):
                if not self._step(out):
                    break
        finally:
            self._buf = self._buf[self._pos:]

    def _step(self, out: list[bytes]) -> bool:
        """One step of the reader; False when it needs more bytes."""
        state = self._state
        buf, pos = self._buf, self._pos
        if state == _HEAD:
            return self._head_line(out)
        if state in (_BODY, _CHUNK_DATA):
            taken = buf[pos:pos + self._remaining]
            self._pos += len(taken)
            self._remaining -= len(taken)
            out.append(taken)
            if self._remaining == 0:
                if state == _BODY:
                    self._message_end()
                else:
                    self._state = _CHUNK_END
        elif state == _CHUNK_SIZE:
            line = self._line(MAX_CHUNK_LINE, "a chunk-size line", 400)
            if line is None:
                return False
            self._chunk_size(line)
            out.append(line)
        elif state == _CHUNK_END:
            got = buf[pos:pos + 2]
            if got != b"\r\n"[:len(got)]:
                raise _bad("a chunk's data is not followed by CRLF (size and data differ)")
            if len(got) < 2:
                return False
            self._pos += 2
            out.append(got)
            self._state = _CHUNK_SIZE
        elif state == _TRAILER:
            line = self._line(MAX_FIELD_LINE, "a trailer line", 431)
            if line is None:
                return False
            out.append(line)
            if line == b"\r\n":
                self._message_end()
            else:
                self._head_size += len(line)
                if self._head_size > MAX_HEAD:
                    raise _too_large(f"trailer section over {MAX_HEAD} bytes")
                self._field(line, trailer=True)
        else:  # _UPGRADED: the rest is the proposed protocol's
            self._passed += len(buf) - pos
            out.append(buf[pos:])
            self._pos = len(buf)
        return True

    def _line(self, limit: int, what: str, status: int) -> bytes | None:
        """The next whole line (CRLF-terminated) taken off the buffer, None while it is
        incomplete; a bare CR or LF, or a line over ``limit``, is a fault."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\n", pos, pos + limit)
        if end < 0:
            if len(buf) - pos >= limit:
                if status == 414:
                    raise HttpError(414, "uri_too_long", f"request line over {limit} bytes")
                raise HttpError(status, "header_too_large" if status == 431 else
                                "malformed_request", f"{what} over {limit} bytes")
            if buf.find(b"\r", pos, len(buf) - 1) >= 0:
                raise _bad(f"bare CR in {what}")
            return None
        if end == pos or buf[end - 1] != 0x0D:
            raise _bad(f"bare LF in {what} (lines end with CRLF)")
        if buf.find(b"\r", pos, end - 1) >= 0:
            raise _bad(f"bare CR in {what}")
        self._pos = end + 1
        return buf[pos:end + 1]

    def _head_line(self, out: list[bytes]) -> bool:
        if self._request is None:
            if self._whole_head(out):
                return True
            line = self._line(MAX_REQUEST_LINE, "the request line", 414)
            if line is None:
                return False
            self._request_line(line)
        else:
            line = self._line(MAX_FIELD_LINE, "a header line", 431)
            if line is None:
                if self._head_size + len(self._buf) - self._pos > MAX_HEAD:
                    raise _too_large(f"request head over {MAX_HEAD} bytes")
                return False
            if line == b"\r\n":
                out.append(self._head_end())
                return True
            self._field(line, trailer=False)
        self._head.append(line)
        self._head_size += len(line)
        if self._head_size > MAX_HEAD:
            raise _too_large(f"request head over {MAX_HEAD} bytes")
        return True

    def _whole_head(self, out: list[bytes]) -> bool:
        """A head wholly in the buffer and well formed, checked in one go (the common
        case, a few times faster); anything else is left to the line-by-line reading,
        which finds the fault."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\r\n\r\n", pos, pos + MAX_HEAD + 2)
        if end < 0:
            return False
        head = buf[pos:end + 2]
        lines = head.count(b"\r\n")
        if head.count(b"\n") != lines or head.count(b"\r") != lines:
            return False
        first = head.find(b"\r\n") + 2
        request = _REQUEST_LINE.fullmatch(head, 0, first)
        if request is None or request[3] != b"1" or first > MAX_REQUEST_LINE:
            return False
        if lines > MAX_FIELDS + 1:
            return False
        fields = []
        at = first
        for match in _FIELD_LINE.finditer(head, first):
            if match.start() != at:  # something between two lines that is not a field
                return False
            at = match.end()
            line = match[0]
            name = match[1].lower()
            if len(line) > MAX_FIELD_LINE or (
                    name in _FRAMING_NAMES and not _STRICT_VALUE.fullmatch(line, len(name))
            ) or (b"_" in name and name.replace(b"_", b"-") in _FRAMING_NAMES):
                return False
            fields.append((name, match[2], line))
        if at != len(head):
            return False
        self._request = (request[1], request[2], head[first - 10:first - 2])
        self._fields = fields
        self._head = [head]
        self._pos = end + 4
        out.append(self._head_end())
        return True

    def _request_line(self, line: bytes) -> None:
        match = _REQUEST_LINE.fullmatch(line)
        if match is None:
            raise _bad("malformed request line (METHOD SP TARGET SP HTTP/1.1 CRLF)")
        method, target, major, _ = match.groups()
        if major != b"1":
            raise HttpError(505, "http_version_not_supported", "only HTTP/1.1 and 1.0")
        self._request = (method, target, line[-10:-2])

    def _field(self, line: bytes, *, trailer: bool) -> None:
        if line[:1] in (b" ", b"\t"):
            raise _bad("obs-fold (a header line starting with whitespace) is not accepted")
        match = _FIELD_LINE.fullmatch(line)
        if match is None:
            raise _bad("malformed header line: the name must be a token right before "
                       "the colon, the value visible characters, SP and HTAB only")
        name = match[1].lower()
        if trailer:
            if name in _FRAMING_NAMES or name == b"host":
                raise _bad(f"{name.decode()} is not allowed in a trailer")
            return
        if name not in _FRAMING_NAMES and name.replace(b"_", b"-") in _FRAMING_NAMES:
            raise _bad(f"header {match[1].decode()!r} reads as a framing header")
        if len(self._fields) >= MAX_FIELDS:
            raise _too_large(f"more than {MAX_FIELDS} header lines")
        if name in _FRAMING_NAMES and not _STRICT_VALUE.fullmatch(line, len(match[1])):
            raise _bad(f"{match[1].decode()}: one SP after the colon at most, and no "
                       "whitespace after the value")
        self._fields.append((name, match[2], line))

    def _head_end(self) -> bytes:
        """The head is whole: decide its framing; the bytes to hand on."""
        assert self._request is not None
        method, target, version = self._request
        fields = self._fields
        lengths = [v for n, v, _ in fields if n == b"content-length"]
        codings = [v for n, v, _ in fields if n == b"transfer-encoding"]
        if codings and version == b"HTTP/1.0":  # faulty whatever else it says (§6.1)
            raise _bad("Transfer-Encoding in an HTTP/1.0 request")
        if lengths and codings:
            raise _bad("Content-Length and Transfer-Encoding together")
        if len(lengths) > 1 or len(codings) > 1:
            raise _bad("more than one Content-Length or Transfer-Encoding header")
        if lengths:
            text = lengths[0]
            if not text.isdigit() or len(text) > 18:
                raise _bad(f"Content-Length must be digits only, got {text!r}")
            self._remaining = int(text)
            self._state = _BODY if self._remaining else _HEAD
        elif codings:
            self._check_codings(codings[0])
            self._state = _CHUNK_SIZE
        head = b"".join(self._head)
        rewritten = self._target(method, target, fields)
        if rewritten is not None:
            head = b"%s %s %s\r\n%s" % (method, rewritten, version,
                                        head[head.index(b"\n") + 1:])
        self._upgrade = any(n == b"upgrade" and v for n, v, _ in fields)
        self._head, self._request, self._fields, self._head_size = [], None, [], 0
        if self._state == _HEAD and self._upgrade:
            self._state = _UPGRADED
        return head + b"\r\n"

    @staticmethod
    def _check_codings(value: bytes) -> None:
        codings = [c.strip(b" \t").lower() for c in value.split(b",")]
        if not all(_TOKEN.fullmatch(c) for c in codings):
            raise _bad(f"malformed Transfer-Encoding {value!r}")
        if codings[-1] != b"chunked" or codings.count(b"chunked") > 1:
            raise _bad("Transfer-Encoding must end with chunked, applied once")
        if len(codings) > 1:
            raise HttpError(501, "unsupported_transfer_coding",
                            "only the chunked transfer coding is supported")

    @staticmethod
    def _target(method: bytes, target: bytes,
                fields: list[tuple[bytes, bytes, bytes]]) -> bytes | None:
        """None for an origin-form target; the origin form of an absolute one."""
        if target.startswith(b"/") or (target == b"*" and method == b"OPTIONS"):
            return None
        absolute = _ABSOLUTE.fullmatch(target)
        if absolute is None:
            raise _bad("the request target must be a path (origin form)")
        hosts = [v for n, v, _ in fields if n == b"host"]
        if len(hosts) != 1 or hosts[0].lower() != absolute[1].lower():
            raise _bad("an absolute request target must name the Host")
        path = absolute[2]
        return path if path.startswith(b"/") else b"/" + path

    def _chunk_size(self, line: bytes) -> None:
        match = _CHUNK_LINE.fullmatch(line)
        if match is None:
            raise _bad("malformed chunk-size line (hex digits, extensions without "
                       "whitespace, CRLF)")
        digits = match[1]
        if len(digits) > 16:
            raise _bad("chunk size of more than 16 hex digits")
        size = int(digits, 16)
        if size > self._max_body:
            raise HttpError(413, "body_too_large",
                            f"chunk of {size} bytes over the limit of {self._max_body}")
        if size:
            self._remaining = size
            self._state = _CHUNK_DATA
        else:
            self._state = _TRAILER

    def _message_end(self) -> None:
        self._head_size = 0
        self._state = _UPGRADED if self._upgrade else _HEAD
