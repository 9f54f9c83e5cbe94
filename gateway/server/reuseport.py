"""Listening sockets that several worker processes share with ``SO_REUSEPORT``.

Each worker binds a listening socket of its own on the same address and port; the kernel
hashes every new connection (its addresses and ports) to one of the sockets listening
there, so connections spread over the workers without any process handing them out.

The supervisor first *reserves* each address (:func:`reserve`): a socket bound with
``SO_REUSEPORT`` that never listens. It fixes the port when port 0 was asked for (every
worker then binds that one), keeps the port while no worker listens (a worker restarting,
all of them down) so that nothing else takes it, and, never listening, receives no
connection itself. Before it, a probe bind without ``SO_REUSEPORT`` makes an address in
use (by another program, or another figtank's workers) an error instead of a share.
"""

from __future__ import annotations

import errno
import socket
from typing import Any, Final

#: trio's own default: the most the kernel allows (it cuts it to ``net.core.somaxconn``).
BACKLOG: Final = 0xFFFF


def _addresses(host: str, port: int) -> list[tuple[int, tuple[Any, ...]]]:
    """``(family, sockaddr)`` of every address ``host`` names, as a server binds them."""
    found = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM,
                               0, socket.AI_PASSIVE)
    return list(dict.fromkeys((family, sockaddr) for family, _, _, _, sockaddr in found))


def _socket(family: int, *, reuse_address: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:  # as trio does: "::" is IPv6 only, "0.0.0.0" apart
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def _probe(family: int, sockaddr: tuple[Any, ...]) -> None:
    """Raise EADDRINUSE when something listens on (or holds) ``sockaddr``; connections
    in TIME_WAIT there do not count."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        probe.bind(sockaddr)


def reserve(host: str, port: int) -> tuple[int, list[socket.socket]]:
    """Hold ``host:port`` for workers that bind it with :func:`shared_sockets`: the port
    (the one the kernel chose when ``port`` is 0) and the sockets holding it (bound, not
    listening; close them when done). Raises OSError (EADDRINUSE: in use)."""
    held: list[socket.socket] = []
    try:
        for family, sockaddr in _addresses(host, port):
            if port:
                _probe(family, (sockaddr[0], port, *sockaddr[2:]))
            # Without SO_REUSEADDR a socket that is not listening still holds the port
            # against a plain bind; connections left in TIME_WAIT by a server without
            # SO_REUSEPORT refuse that bind, so it is then made with both.
            where = (sockaddr[0], port, *sockaddr[2:])
            sock = _socket(family, reuse_address=False)
            held.append(sock)
            try:
                sock.bind(where)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or not port:
                    raise
                sock.close()
                held[-1] = sock = _socket(family, reuse_address=True)
                sock.bind(where)
            port = port or sock.getsockname()[1]
        return port, held
    except BaseException:
        for sock in held:
            sock.close()
        raise


def shared_sockets(host: str, port: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """Listening sockets on ``host:port`` (every address of ``host``) that other sockets
    with ``SO_REUSEPORT`` share. Raises OSError."""
    made: list[socket.socket] = []
    try:
        for family, sockaddr in _addresses(host, port):
            sock = _socket(family, reuse_address=True)
            made.append(sock)
            sock.bind(sockaddr)
            sock.listen(backlog)
        return made
    except BaseException:
        for sock in made:
            sock.close()
        raise
