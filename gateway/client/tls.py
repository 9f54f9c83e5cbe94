"""TLS for figtank's clients: the context (:func:`client_context`) and a connection that
is TLS when given one (:func:`open_stream`).

A client verifies the server's certificate against ``ca`` (else the system's trusted
CAs) and its name against the host it dials (an IP address must be in the certificate's
subjectAltName); ``cert`` and ``key`` are its own certificate for a mutual-TLS listener.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import trio

from gateway.client.errors import ConnectError
from gateway.io.tls import readable, tls_reason

__all__ = [
    "PathLike", "TLSHandshakeFailed", "client_context", "open_stream", "tls_failure",
]

PathLike = str | Path


class TLSHandshakeFailed(ConnectError):
    """The TLS handshake with the server failed (or the server refused the client's
    certificate right after it); the message says why."""


def client_context(*, ca: PathLike | None = None, cert: PathLike | None = None,
                   key: PathLike | None = None) -> ssl.SSLContext:
    """A client context: TLS 1.2+, the server verified against ``ca`` (PEM; None: the
    system's CAs), ``cert``/``key`` (PEM) presented when the server asks. Raises
    ``ValueError`` naming the file that does not load."""
    if key is not None and cert is None:
        raise ValueError("a key without a certificate: give the certificate as well")
    for path in (ca, cert, key):
        readable(path)
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except OSError as exc:
        raise ValueError(f"cannot load the CA {ca}: {tls_reason(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except OSError as exc:
            raise ValueError(f"cannot load the certificate {cert}"
                             f"{f' with the key {key}' if key else ''}: {tls_reason(exc)}"
                             ) from None
    return context


def tls_failure(exc: BaseException) -> str | None:
    """Why TLS ended the connection, when ``exc`` (a receive or send failure) is the TLS
    layer's (the server refused the client's certificate...); else None."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return tls_reason(cause)
        cause = cause.__cause__ or cause.__context__
    return None


async def open_stream(host: str, port: int, ssl_context: ssl.SSLContext | None, *,
                      server_hostname: str | None = None) -> trio.abc.Stream:
    """A TCP connection to ``host:port``, over TLS (handshake done) when ``ssl_context``
    is given. Raises ``OSError`` when it can not connect, :class:`TLSHandshakeFailed`
    when the handshake fails."""
    stream = await trio.open_tcp_stream(host, port)
    if ssl_context is None:
        return stream
    tls: trio.SSLStream[trio.abc.Stream] = trio.SSLStream(
        stream, ssl_context, server_hostname=server_hostname or host, https_compatible=True)
    try:
        await tls.do_handshake()
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        await trio.aclose_forcefully(stream)
        raise TLSHandshakeFailed(f"TLS handshake failed: {tls_reason(exc)}") from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls
