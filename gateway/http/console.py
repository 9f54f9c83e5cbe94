"""The web console and the JavaScript client: static files shipped in the package
(``gateway/http/static/``), read once and served from memory. No CDN, no build step: the
client's one source is the ES module ``figtank.mjs``, served as it is at ``/figtank.mjs``
and as a classic script at ``/figtank.js`` (:mod:`gateway.http.clientjs`), with its
TypeScript declarations at ``/figtank.d.ts``."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from gateway.http.clientjs import classic_script
from gateway.http.request import Answer, HttpError, Request
from gateway.http.session import HttpSession

_TYPES = {"js": b"text/javascript; charset=utf-8", "mjs": b"text/javascript; charset=utf-8",
          "ts": b"application/typescript; charset=utf-8", "html": b"text/html; charset=utf-8",
          "css": b"text/css; charset=utf-8", "svg": b"image/svg+xml"}


@cache
def static_file(name: str) -> bytes:
    """The bytes of ``static/NAME`` (cached for the life of the process)."""
    if name == "figtank.js":
        return classic_script(static_file("figtank.mjs").decode()).encode()
    return (files("gateway.http") / "static" / name).read_bytes()


def _serve(name: str) -> Answer:
    try:
        body = static_file(name)
    except (FileNotFoundError, IsADirectoryError):
        raise HttpError(404, "not_found", f"no file {name!r}") from None
    kind = _TYPES.get(name.rsplit(".", 1)[-1], b"application/octet-stream")
    return Answer(200, kind, body, [(b"cache-control", b"no-cache")])


async def client_script(session: HttpSession, request: Request) -> Answer:
    """``/figtank.js`` (classic script), ``/figtank.mjs`` (ES module), ``/figtank.d.ts``."""
    return _serve(request.path.lstrip("/"))


async def index(session: HttpSession, request: Request) -> Answer:
    return _serve("index.html")


async def asset(session: HttpSession, request: Request) -> Answer:
    name = request.params["name"]
    if name not in ("console.js", "console.css"):
        raise HttpError(404, "not_found", f"no file {name!r}")
    return _serve(name)
