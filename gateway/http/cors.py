"""Origins: which pages may call the HTTP listener (``http.cors_origins``), and the guard
that refuses writes from every other page.

**Same origin.** A request is same-origin when its ``Origin`` names this listener: the
Origin's host (and port, the scheme's default port left out on both sides) equals the
``Host`` header and its scheme is the listener's (``http``, or ``https`` under TLS), or
the one ``X-Forwarded-Proto`` names (a reverse proxy that ends TLS in front of a plain
listener says ``https``; a page can not set that header on a request of another origin
without a preflight, which such an origin fails).

**Allowed.** Same origin, an origin listed in ``http.cors_origins``, or any origin when
that list has ``*``.

**Foreign.** A request is foreign when its ``Origin`` is not allowed (``Origin: null``,
the opaque origin of a sandboxed frame or a ``data:`` page, is foreign unless the list has
``*``), or, without an ``Origin``, when its ``Sec-Fetch-Site`` is ``cross-site`` or
``same-site`` (it comes from another origin and, naming none, cannot be matched against
the list; browsers send ``Origin`` with every write, so this refuses nothing a listed page
does). ``same-origin`` and ``none`` (typed in the address bar, a bookmark) are not foreign.
A request with neither header (curl, a server-side client) is not a browser's and is not
foreign: such clients are held by the access policy alone.

**What a foreign page can do.** Browsers let any page *send* a simple request (a form, a
``fetch`` with ``mode: "no-cors"``) without asking: CORS only decides whether the page may
*read* the answer. So the listener refuses every state-changing request (any method but
``GET``, ``HEAD`` and ``OPTIONS``) from a foreign page with 403 ``origin_not_allowed``
before its handler runs (:meth:`Cors.check_write`, called by the router): nothing is
appended. Its reads are answered, without ``Access-Control-Allow-Origin``, so the page can
not read them. A WebSocket upgrade from a foreign page is refused (403,
:meth:`Cors.check_websocket`), as browsers apply no CORS to WebSocket. A preflight
(``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed origin gets 204 with
the methods and headers allowed (the requested ones the listener takes, echoed), from any
other origin 403.
"""

from __future__ import annotations

from typing import Final

from gateway.http.request import Answer, HttpError, Request

_METHODS = b"GET, POST, OPTIONS"
#: The request headers the docs name (a preflight allows these, and only these).
ALLOWED_HEADERS: Final = ("authorization", "content-type", "figtank-key",
                          "figtank-key-base64", "last-event-id")
_EXPOSED = b"figtank-next-offset, figtank-high-water-mark"
#: Methods that change nothing: never refused for their origin (reads are protected by
#: the browser withholding the answer).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS: Final = {"http": "80", "https": "443"}
#: Sec-Fetch-Site values that say the request comes from another origin.
_OTHER_SITES: Final = frozenset({"cross-site", "same-site"})


def _authority(host: str, scheme: str) -> str:
    """``host[:port]`` lower-cased, without the scheme's default port."""
    host = host.strip().lower()
    name, colon, port = host.rpartition(":")
    if colon and port == _DEFAULT_PORTS.get(scheme):
        return name
    return host


class Cors:
    """The allowed origins (``*``: any) of a listener whose scheme is ``scheme``."""

    def __init__(self, origins: tuple[str, ...], scheme: str = "http") -> None:
        self.any = "*" in origins
        self.origins = frozenset(origins)
        self.scheme = scheme

    def allows(self, origin: str) -> bool:
        """Whether ``origin`` is listed (or the list has ``*``); not the same-origin test."""
        return self.any or origin in self.origins

    def same_origin(self, origin: str, host: str | None, forwarded_proto: str | None = None
                    ) -> bool:
        """Whether ``origin`` names this listener as reached through ``host`` (and a proxy
        that says the client's scheme was ``forwarded_proto``)."""
        scheme, sep, authority = origin.partition("://")
        scheme = scheme.lower()
        ours = self.scheme
        if forwarded_proto:
            ours = forwarded_proto.split(",")[0].strip().lower()
        if not sep or not host or scheme != ours or "/" in authority:
            return False
        return _authority(authority, scheme) == _authority(host, scheme)

    def foreign(self, request: Request) -> str | None:
        """Why ``request`` comes from a foreign page (see the module doc), or None."""
        origin = request.header("origin")
        if origin is not None:
            if self.allows(origin):
                return None
            if origin.strip().lower() == "null":
                return "origin 'null' (an opaque origin) is not allowed"
            if self.same_origin(origin, request.header("host"),
                                request.header("x-forwarded-proto")):
                return None
            return f"origin {origin!r} is not allowed"
        site = (request.header("sec-fetch-site") or "").strip().lower()
        if site in _OTHER_SITES and not self.any:
            return f"a {site} request without an Origin is not allowed"
        return None

    def _refuse_foreign(self, request: Request, what: str) -> None:
        why = self.foreign(request)
        if why is not None:
            raise HttpError(403, "origin_not_allowed", f"{why} to {what}")

    def check_write(self, request: Request) -> None:
        """403 ``origin_not_allowed`` for a state-changing request from a foreign page."""
        if request.method not in SAFE_METHODS:
            self._refuse_foreign(request, f"{request.method} here")

    def check_websocket(self, request: Request) -> None:
        """403 ``origin_not_allowed`` for a WebSocket upgrade from a foreign page."""
        self._refuse_foreign(request, "open a WebSocket")

    def apply(self, request: Request, headers: list[tuple[bytes, bytes]]) -> None:
        """Add the CORS headers an answer to ``request`` needs."""
        origin = request.header("origin")
        if origin and self.allows(origin):
            headers += [(b"access-control-allow-origin", origin.encode("latin-1")),
                        (b"vary", b"origin"), (b"access-control-expose-headers", _EXPOSED)]

    def preflight(self, request: Request) -> Answer:
        """The answer to ``OPTIONS``: 204 with what an allowed origin may send, else 403."""
        origin = request.header("origin") or ""
        if not self.allows(origin):
            raise HttpError(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
        answer = Answer(204, b"text/plain", b"")
        self.apply(request, answer.headers)
        answer.headers += [(b"access-control-allow-methods", _METHODS),
                           (b"access-control-allow-headers", _allowed_headers(request)),
                           (b"access-control-max-age", b"600"),
                           (b"vary", b"access-control-request-headers")]
        return answer


def _allowed_headers(request: Request) -> bytes:
    """The requested headers the listener takes (all it takes when none are named)."""
    asked = [name.strip().lower() for name in
             (request.header("access-control-request-headers") or "").split(",")]
    wanted = [name for name in asked if name in ALLOWED_HEADERS]
    return ", ".join(wanted or ALLOWED_HEADERS).encode()
