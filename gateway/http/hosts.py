"""Which ``Host`` names the HTTP listener answers to: the guard against DNS rebinding.

A page of ``http://evil.example:8080`` whose name the attacker's DNS turns into
``127.0.0.1`` is, to the browser, the same origin as figtank's listener on that address:
it could read topics and write to them as a page of figtank's own. Such a request still
carries the attacker's name in ``Host``, so a listener on a loopback address answers only
to names that can not be rebound: IP literals, ``localhost`` and ``*.localhost``, names
of one label (``figtank``, not a public DNS name), and those listed in
``http.allowed_hosts`` (``.example.com`` for it and its subdomains). Any other ``Host`` is
421 ``host_not_allowed`` (RFC 9110 §15.5.20: the listener will not answer for that
authority) before anything is routed. A listener on another address answers to every name
unless ``http.allowed_hosts`` is set; ``*`` in it lets every name through everywhere.
Behind a reverse proxy that passes the browser's ``Host`` on (deploy/nginx), list the
public name.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

import trio

from gateway.http.request import HttpError, Request


def host_name(host: str) -> str:
    """The name of a ``Host`` header (``[::1]:8080`` -> ``::1``), lower-cased, without
    its port or a trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if ":" in host else host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(stream: trio.abc.Stream) -> bool:
    """Whether the connection ``stream`` (TLS or not) was accepted on a loopback address."""
    under: object = stream
    while not hasattr(under, "socket") and hasattr(under, "transport_stream"):
        under = under.transport_stream
    if not hasattr(under, "socket"):
        return False
    try:
        address = under.socket.getsockname()[0]
        return ipaddress.ip_address(address.partition("%")[0]).is_loopback
    except (AttributeError, OSError, ValueError):
        return False


class OnLoopback(Protocol):
    """A connection that can say whether it came in on a loopback address."""

    @property
    def on_loopback(self) -> bool: ...


class HostGuard:
    """The names a listener answers to (see the module doc)."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.any = "*" in allowed
        self.listed = bool(allowed)
        self.names = frozenset(n.lower().rstrip(".") for n in allowed if not n.startswith("."))
        self.suffixes = tuple(n.lower().rstrip(".") for n in allowed if n.startswith("."))

    def answers_to(self, name: str) -> bool:
        """Whether ``name`` is one that can not be rebound, or is listed."""
        if "." not in name or _is_ip(name) or name == "localhost" or name.endswith(
                ".localhost"):
            return True
        return name in self.names or any(
            name == suffix[1:] or name.endswith(suffix) for suffix in self.suffixes)

    def check(self, request: Request, session: OnLoopback) -> None:
        """421 ``host_not_allowed`` for a ``Host`` this listener does not answer to on
        ``session``'s connection (:attr:`~gateway.http.session.HttpSession.on_loopback`:
        its socket is asked once, and only for a name that could be rebound)."""
        if self.any:
            return
        name = host_name(request.header("host") or "")
        if self.answers_to(name) or not (self.listed or session.on_loopback):
            return
        raise HttpError(421, "host_not_allowed", f"this listener does not answer to host "
                        f"{name[:80]!r} (list it in http.allowed_hosts)")
