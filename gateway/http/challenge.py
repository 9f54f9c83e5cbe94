"""``WWW-Authenticate: Bearer`` challenges (RFC 6750 §3) of the HTTP listener.

- No credentials, and a token could help: ``Bearer realm="figtank"`` (no error).
- A token that is not valid (unknown, expired, wrong key or audience):
  ``Bearer realm="figtank", error="invalid_token", error_description="..."``.
- A valid token whose user may not do it: ``Bearer realm="figtank",
  error="insufficient_scope"`` (on the 403).
"""

from __future__ import annotations

import re
from typing import Final

REALM: Final = "figtank"
_HEADER: Final = b"www-authenticate"
#: Characters RFC 6750 §3 allows in error_description (%x20-21 / %x23-5B / %x5D-7E).
_NOT_ALLOWED: Final = re.compile(r'[^\x20\x21\x23-\x5b\x5d-\x7e]')


def _value(*params: tuple[str, str]) -> bytes:
    return ("Bearer " + ", ".join(f'{name}="{value}"' for name, value in
                                  (("realm", REALM), *params))).encode("ascii")


def bearer_challenge() -> tuple[bytes, bytes]:
    """The header of a 401 to a request without credentials."""
    return _HEADER, _value()


def invalid_token_challenge(description: str) -> tuple[bytes, bytes]:
    """The header of a 401 to a request whose token is not valid (``description``: why,
    cut to 200 characters, with the characters RFC 6750 forbids replaced)."""
    text = _NOT_ALLOWED.sub("?", description[:200])
    return _HEADER, _value(("error", "invalid_token"), ("error_description", text))


def insufficient_scope_challenge() -> tuple[bytes, bytes]:
    """The header of a 403 to a request whose valid token does not allow it."""
    return _HEADER, _value(("error", "insufficient_scope"))
