"""What the TLS code of the listeners and the clients shares: file checks, and OpenSSL's
failures said in words."""

from __future__ import annotations

import ssl
from pathlib import Path

PathLike = str | Path


def readable(path: PathLike | None) -> None:
    """Raise ``ValueError`` (``cannot read PATH: No such file or directory``) unless
    ``path`` (None: nothing) can be opened for reading."""
    if path is None:
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


#: OpenSSL's reasons that say little, in words.
_WORDS = {"PEM_LIB": "not a PEM certificate, or no PEM key for it (a key file, or the key "
                     "in the certificate's file)",
          "KEY_VALUES_MISMATCH": "the key is not the certificate's key",
          "NO_START_LINE": "no PEM data in it"}


def tls_reason(exc: BaseException) -> str:
    """What a TLS failure says, in words (``certificate verify failed: ...``)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError) and cause.verify_message:
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError) and cause.reason in _WORDS:
        return _WORDS[cause.reason]
    if isinstance(cause, ssl.SSLError) and cause.reason:
        return cause.reason.lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
