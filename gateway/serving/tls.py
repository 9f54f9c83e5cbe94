"""TLS on a listener: its certificate, the handshake of each connection, client identities.

A listener with a certificate (``tls_cert`` and ``tls_key``) serves every connection over
a :class:`trio.SSLStream`: TLS 1.2 or newer, the server defaults of
``ssl.create_default_context(Purpose.CLIENT_AUTH)``. With ``tls_client_ca`` it is mutual
TLS: the handshake refuses a client without a certificate signed by that CA, and the
client's identity is its certificate's subject (:func:`subject_identity`).

The handshake runs in the connection's own task (never in the accept loop) within
``limits.tls_handshake_timeout_secs``; a failure closes the connection with one
``tls_handshake_failed`` log line (peer, listener, reason) and counts it in
``figtank_tls_handshake_failures_total{listener,reason}`` (a timeout also as
``figtank_limit_hits{limit="tls_handshake_timeout_secs"}``).

:meth:`ListenerTLS.reload` (SIGHUP) reads the files again: new connections use the new
certificate, key and CA; open ones keep theirs. A file that does not load keeps the
context in force.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any, Final

import structlog
import trio

from gateway.core.config import TLSFiles
from gateway.core.metrics import Metrics
from gateway.io.tls import readable, tls_reason

log = structlog.get_logger("figtank.tls")

#: RFC 4514 short names of the attributes ``getpeercert()`` names in full; others keep
#: the name OpenSSL gives them.
_SHORT_NAMES: Final = {
    "commonName": "CN", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
    "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID",
}


def server_context(files: TLSFiles) -> ssl.SSLContext:
    """A server context for ``files``: TLS 1.2+, client certificates required when a
    client CA is given. Raises ``ValueError`` naming the file that does not load."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for path in (files.cert, files.key, files.client_ca):
        readable(path)
    try:
        context.load_cert_chain(files.cert, files.key)
    except OSError as exc:  # ssl.SSLError is an OSError
        raise ValueError(f"cannot load the certificate {files.cert} with the key "
                         f"{files.key}: {tls_reason(exc)}") from None
    if files.client_ca is not None:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except OSError as exc:
            raise ValueError(f"cannot load the client CA {files.client_ca}: "
                             f"{tls_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def subject_identity(cert: dict[str, Any]) -> str | None:
    """The subject of a certificate as ``getpeercert()`` gives it, as an RFC 4514
    string: the most specific RDN first (``CN=alice,OU=ops,O=acme``), short names for the
    usual attributes, the values of a multi-valued RDN joined with ``+``, special
    characters escaped with a backslash. None when the certificate has no subject."""
    rdns = cert.get("subject") or ()
    parts = ["+".join(f"{_SHORT_NAMES.get(name, name)}={_escape(value)}"
                      for name, value in rdn)
             for rdn in reversed(rdns)]
    return ",".join(parts) or None


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (ch == "#" and i == 0) or (
                ch == " " and (i == 0 or i == len(value) - 1)):
            out.append("\\" + ch)
        elif ch == "\0":
            out.append("\\00")
        else:
            out.append(ch)
    return "".join(out)


class ListenerTLS:
    """The TLS of one listener (named ``listener``): the context new connections get,
    reloadable (:meth:`reload`), and the handshake (:meth:`accept`)."""

    def __init__(self, listener: str, files: TLSFiles, metrics: Metrics, *,
                 timeout: float) -> None:
        self.listener = listener
        self.files = files
        self.metrics = metrics
        self.timeout = timeout
        #: The context new connections get (replaced by :meth:`reload`).
        self.context = server_context(files)

    def reload(self) -> None:
        """Load the files again for the connections accepted from now on; raises
        ``ValueError`` and keeps the context in force when they do not load."""
        self.context = server_context(self.files)

    async def accept(self, stream: trio.abc.Stream, peer: str
                     ) -> trio.SSLStream[trio.abc.Stream] | None:
        """Run the server's handshake on ``stream``: the TLS stream, or None (logged and
        counted) when it failed or took longer than the timeout. The caller closes
        ``stream`` either way."""
        tls = trio.SSLStream(stream, self.context, server_side=True,
                             https_compatible=True)
        reason = kind = ""
        with trio.move_on_after(self.timeout or float("inf")) as scope:
            try:
                await tls.do_handshake()
                return tls
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                cause = exc.__cause__
                if isinstance(cause, ssl.SSLError):
                    kind, reason = "refused", tls_reason(cause)
                    await _send_alert(tls, stream)
                else:
                    kind, reason = "eof", "the client closed the connection"
        if scope.cancelled_caught:
            kind = "timeout"
            reason = f"no handshake within {self.timeout:g} s"
            self.metrics.limit_hit("tls_handshake_timeout_secs")
        self.metrics.tls_handshake_failures.labels(self.listener, kind).inc()
        log.warning("tls_handshake_failed", listener=self.listener, peer=peer, kind=kind,
                    reason=reason)
        return None


async def _send_alert(tls: trio.SSLStream[trio.abc.Stream], stream: trio.abc.Stream) -> None:
    """Send the alert a failed handshake left unsent (trio drops it), so the client
    learns why (``certificate required``) instead of seeing the connection close."""
    outgoing = getattr(tls, "_outgoing", None)  # trio's MemoryBIO; best effort
    if not isinstance(outgoing, ssl.MemoryBIO) or not outgoing.pending:
        return
    with trio.move_on_after(0.5):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(outgoing.read())


def peer_identity(stream: trio.abc.Stream) -> str | None:
    """The client certificate identity of a TLS stream after its handshake (mutual TLS),
    else None."""
    if not isinstance(stream, trio.SSLStream):
        return None
    cert = stream.getpeercert()
    return subject_identity(cert) if cert else None
