"""Which handler serves which request: ``(method, path pattern)`` -> handler.

Paths are matched as patterns of ``{name}`` segments (a segment: anything but ``/``). A
path no route matches is 404; one matched for another method 405 (with ``Allow``).
A ``Host`` the listener does not answer to is 421 first (:mod:`gateway.http.hosts`: DNS
rebinding). Preflights (``OPTIONS``) are answered by CORS, and a state-changing request
from a foreign page is refused (403 ``origin_not_allowed``) before any route is looked at
(:mod:`gateway.http.cors`). A refusal of the access policy gets its Bearer challenge here
(:func:`gateway.http.auth.challenge`), whichever handler raised it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from gateway.http.auth import challenge
from gateway.http.request import Answer, HttpError, Request
from gateway.http.session import HttpSession

Handler = Callable[[HttpSession, Request], Awaitable[Answer | None]]


class Router:
    """The routes of the listener."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        """Serve ``method`` on paths like ``pattern`` (``/topics/{topic}``) with
        ``handler(session, request)``."""
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
        self._routes.append((method, re.compile(f"^{regex}$"), handler))

    async def dispatch(self, session: HttpSession, request: Request) -> Answer | None:
        """Run the handler of ``request``; its answer gets the CORS headers."""
        session.listener.hosts.check(request, session)
        cors = session.listener.cors
        if request.method == "OPTIONS":
            return cors.preflight(request)
        cors.check_write(request)
        allowed = []
        chosen = None
        for method, regex, handler in self._routes:
            found = regex.match(request.path)
            if found is None:
                continue
            if method != request.method and not (method == "GET" and request.method == "HEAD"):
                allowed.append(method)
                continue
            request.params = found.groupdict()
            chosen = handler
            break
        if chosen is not None:
            # Only the handler's frame stays while it serves (a stream may last for days).
            del found, allowed
            try:
                answer = await chosen(session, request)
            except HttpError as error:
                raise challenge(session, request, error) from None
            if answer is not None:
                cors.apply(request, answer.headers)
            return answer
        if allowed:
            raise HttpError(405, "method_not_allowed", f"{request.method} is not served on "
                            f"{request.path}", [(b"allow", ", ".join(allowed).encode())])
        raise HttpError(404, "not_found", f"nothing at {request.path}")
