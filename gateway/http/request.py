"""A request as the session read it, the answers it gets, and refusals.

A handler raises :class:`HttpError` for anything the client did wrong; the session turns
it into a JSON answer ``{"error": code, "message": ...}`` with its status and logs one
``http_request_refused`` line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from gateway.http.messages import dumps

JSON = b"application/json"
NDJSON = b"application/x-ndjson"


class HttpError(Exception):
    """A refusal: ``status`` (4xx, 5xx), a short ``code`` (in the metric and the log) and
    the message for the client; ``details``: more fields of the answer's JSON object (a
    produce's per-message outcome)."""

    def __init__(self, status: int, code: str, message: str,
                 headers: list[tuple[bytes, bytes]] | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or []
        self.details = details


@dataclass(slots=True)
class Request:
    """One HTTP request: its method, path (percent-decoded), query parameters, headers
    (lower-case names, last one wins) and body."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes = b""
    #: Path parameters the route matched (``topic``, ``partition``).
    params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]]
              ) -> Request:
        raw_path, _, raw_query = target.decode("latin-1").partition("?")
        try:
            query = dict(parse_qsl(raw_query, keep_blank_values=True, strict_parsing=False,
                                   errors="strict"))
            path = unquote(raw_path, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise HttpError(400, "bad_target", "the request target is not valid UTF-8"
                            ) from None
        return cls(method.decode("latin-1"), path, query,
                   {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in headers})

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)

    def int_param(self, name: str, default: int | None = None, *, minimum: int = 0
                  ) -> int | None:
        """Query parameter ``name`` as an int >= ``minimum``; 400 when it is not one."""
        text = self.query.get(name)
        if text is None or text == "":
            return default
        if not text.isascii() or not text.lstrip("-").isdigit():
            raise HttpError(400, "bad_parameter", f"{name} must be an integer, got {text!r}")
        value = int(text)
        if value < minimum:
            raise HttpError(400, "bad_parameter", f"{name} must be >= {minimum}")
        return value

    def wants_ndjson(self) -> bool:
        """Whether the answer should be NDJSON (``format=ndjson`` or the Accept header)."""
        wanted = self.query.get("format")
        if wanted is not None:
            if wanted not in ("json", "ndjson"):
                raise HttpError(400, "bad_parameter", "format must be json or ndjson")
            return wanted == "ndjson"
        return "application/x-ndjson" in (self.headers.get("accept") or "")


@dataclass(slots=True)
class Answer:
    """A whole answer: status, content type, body and more headers."""

    status: int
    content_type: bytes
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def json_answer(value: object, status: int = 200) -> Answer:
    return Answer(status, JSON, dumps(value) + b"\n")


def error_answer(error: HttpError) -> Answer:
    return Answer(error.status, JSON,
                  dumps({"error": error.code, "message": error.message,
                         **(error.details or {})}) + b"\n",
                  list(error.headers))
