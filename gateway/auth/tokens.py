"""Static bearer tokens of the access policy file: its ``[[token]]`` entries.

Each entry maps a token to the user it acts as (rules name it ``user:NAME``)::

    [[token]]
    user = "dashboard"
    sha256 = "<hex SHA-256 of the token>"     # or: token = "<the token itself>"

Keeping only the hash in the file is preferred (``printf %s TOKEN | sha256sum``). Tokens
are compared by their SHA-256, in constant time per entry. This module does no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

from gateway.auth.entries import policy_tables

_KEYS: Final = ("user", "sha256", "token")


class StaticTokens:
    """The tokens of a policy file: SHA-256 digest -> user."""

    def __init__(self, by_digest: Mapping[bytes, str] | None = None) -> None:
        self._by_digest = dict(by_digest or {})

    def __len__(self) -> int:
        return len(self._by_digest)

    def user_of(self, token: str) -> str | None:
        """The user ``token`` acts as, or None."""
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for known, user in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                found = user
        return found


NO_TOKENS: Final = StaticTokens()


def parse_tokens(entries: object) -> StaticTokens:
    """The tokens of a policy file's ``[[token]]`` entries; ``ValueError`` with one line
    naming the entry's index and key."""
    by_digest: dict[bytes, str] = {}
    for where, entry in policy_tables(entries, "token", _KEYS):
        user = entry.get("user")
        if not isinstance(user, str) or not user:
            raise ValueError(f"{where}.user: must be a non-empty string")
        if ("sha256" in entry) == ("token" in entry):
            raise ValueError(f"{where}: give exactly one of sha256 and token")
        if "token" in entry:
            token = entry["token"]
            if not isinstance(token, str) or len(token) < 16:
                raise ValueError(f"{where}.token: must be a string of at least 16 characters")
            digest = hashlib.sha256(token.encode()).digest()
        else:
            text = entry["sha256"]
            try:
                digest = bytes.fromhex(text) if isinstance(text, str) else b""
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise ValueError(f"{where}.sha256: must be 64 hex digits")
        if digest in by_digest:
            raise ValueError(f"{where}: the same token is given twice")
        by_digest[digest] = user
    return StaticTokens(by_digest)
