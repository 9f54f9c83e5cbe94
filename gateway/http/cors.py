"""CORS: which other origins' pages may call the HTTP listener (``http.cors_origins``).

A request whose ``Origin`` is allowed gets ``Access-Control-Allow-Origin`` (and
``Vary: Origin``) on its answer; a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) from an allowed origin gets 204 with the methods and
headers allowed, from any other origin 403. Browsers enforce the rest: without the header
a page of another origin can not read the answer. EventSource and WebSocket carry an
``Origin`` too: a WebSocket upgrade from an origin not allowed is refused (403), as
browsers do not apply CORS to WebSocket.
"""

from __future__ import annotations

from gateway.http.request import Answer, HttpError, Request

_METHODS = b"GET, POST, OPTIONS"
_HEADERS = b"authorization, content-type, figtank-key, last-event-id"
_EXPOSED = b"figtank-next-offset, figtank-high-water-mark"


class Cors:
    """The allowed origins (``*``: any)."""

    def __init__(self, origins: tuple[str, ...]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(origins)

    def allows(self, origin: str) -> bool:
        return self.any or origin in self.origins

    def apply(self, request: Request, headers: list[tuple[bytes, bytes]]) -> None:
        """Add the CORS headers an answer to ``request`` needs."""
        origin = request.header("origin")
        if origin and self.allows(origin):
            headers += [(b"access-control-allow-origin", origin.encode("latin-1")),
                        (b"vary", b"origin"), (b"access-control-expose-headers", _EXPOSED)]

    def check_websocket(self, request: Request, host: str | None) -> None:
        """Refuse (403) an upgrade from a page of an origin not allowed (same origin is)."""
        origin = request.header("origin")
        if not origin or self.allows(origin):
            return
        if host and origin.split("://", 1)[-1] == host:
            return
        raise HttpError(403, "origin_not_allowed", f"origin {origin!r} is not allowed")

    def preflight(self, request: Request) -> Answer:
        origin = request.header("origin") or ""
        if not self.allows(origin):
            raise HttpError(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
        answer = Answer(204, b"text/plain", b"")
        self.apply(request, answer.headers)
        answer.headers += [(b"access-control-allow-methods", _METHODS),
                           (b"access-control-allow-headers", _HEADERS),
                           (b"access-control-max-age", b"600")]
        return answer
