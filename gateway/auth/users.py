"""SASL users of the access policy file: its ``[[user]]`` entries.

Each entry names a user and holds its SCRAM credentials, never its password::

    [[user]]
    name = "alice"
    scram_sha_256 = { salt = "<base64>", iterations = 4096, stored_key = "<base64>",
                      server_key = "<base64>" }
    scram_sha_512 = { ... }

A user may log in with each SCRAM mechanism it has a credential for, and with PLAIN
(checked against its SCRAM-SHA-256 credential, else its SCRAM-SHA-512 one).
``figtank users add NAME`` makes an entry (:func:`user_entry`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from gateway.auth.entries import policy_tables
from gateway.auth.sasl import (
    MAX_USER_CHARS,
    MIN_ITERATIONS,
    SCRAM_HASHES,
    ScramCredential,
    UserCredentials,
    scram_credential,
)

#: The key of each SCRAM mechanism's credential in a ``[[user]]`` entry.
CREDENTIAL_KEYS: Final = {"scram_sha_256": "SCRAM-SHA-256", "scram_sha_512": "SCRAM-SHA-512"}
_CREDENTIAL_FIELDS: Final = ("salt", "iterations", "stored_key", "server_key")


class Users:
    """The users of a policy file, by name."""

    def __init__(self, users: Mapping[str, UserCredentials] | None = None) -> None:
        self._users: Mapping[str, UserCredentials] = MappingProxyType(dict(users or {}))

    def __len__(self) -> int:
        return len(self._users)

    def __contains__(self, name: object) -> bool:
        return name in self._users

    def lookup(self, name: str) -> UserCredentials | None:
        """The credentials of user ``name``, by mechanism (None: no such user)."""
        return self._users.get(name)


#: No users (no policy file, or one without ``[[user]]``).
NO_USERS: Final = Users()


def parse_users(entries: object) -> Users:
    """The users of a policy file's ``[[user]]`` entries (as ``tomllib`` reads them).

    Raises ``ValueError`` with one line naming the entry's index and key, e.g.
    ``user[0].scram_sha_256.iterations: must be an integer >= 4096, got 100``."""
    users: dict[str, UserCredentials] = {}
    for where, entry in policy_tables(entries, "user", ("name", *CREDENTIAL_KEYS)):
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_USER_CHARS:
            raise ValueError(f"{where}.name: must be a non-empty string of at most "
                             f"{MAX_USER_CHARS} characters, got {name!r}")
        if name in users:
            raise ValueError(f"{where}.name: user {name!r} is given twice")
        credentials = {mechanism: _credential(entry[key], f"{where}.{key}")
                       for key, mechanism in CREDENTIAL_KEYS.items() if key in entry}
        if not credentials:
            raise ValueError(f"{where}: no credential (give {' or '.join(CREDENTIAL_KEYS)}; "
                             "`figtank users add` makes them)")
        users[name] = MappingProxyType(credentials)
    return Users(users)


def _credential(value: object, where: str) -> ScramCredential:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a table with {', '.join(_CREDENTIAL_FIELDS)}")
    for key in value:
        if key not in _CREDENTIAL_FIELDS:
            raise ValueError(f"{where}.{key}: unknown key (expected "
                             f"{', '.join(_CREDENTIAL_FIELDS)})")
    for key in _CREDENTIAL_FIELDS:
        if key not in value:
            raise ValueError(f"{where}.{key}: missing")
    iterations = value["iterations"]
    if not isinstance(iterations, int) or isinstance(iterations, bool) \
            or iterations < MIN_ITERATIONS:
        raise ValueError(f"{where}.iterations: must be an integer >= {MIN_ITERATIONS}, "
                         f"got {iterations!r}")
    raw = {}
    for key in ("salt", "stored_key", "server_key"):
        try:
            raw[key] = base64.b64decode(value[key], validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise ValueError(f"{where}.{key}: must be base64, got {value[key]!r}") from None
        if not raw[key]:
            raise ValueError(f"{where}.{key}: must not be empty")
    return ScramCredential(raw["salt"], iterations, raw["stored_key"], raw["server_key"])


def user_entry(name: str, password: str, mechanisms: list[str],
               iterations: int = MIN_ITERATIONS) -> str:
    """The ``[[user]]`` TOML of user ``name`` with ``password`` for ``mechanisms``
    (SCRAM names; PLAIN is served by either). Raises ``ValueError`` on a bad argument."""
    if not name or len(name) > MAX_USER_CHARS:
        raise ValueError(f"a user name is 1-{MAX_USER_CHARS} characters")
    if not password:
        raise ValueError("the password is empty")
    lines = ["[[user]]", f"name = {_toml_string(name)}"]
    for key, mechanism in CREDENTIAL_KEYS.items():
        if mechanism not in mechanisms:
            continue
        c = scram_credential(password, mechanism, iterations)
        fields = ", ".join(f"{k} = \"{base64.b64encode(v).decode()}\"" for k, v in
                           (("salt", c.salt), ("stored_key", c.stored_key),
                            ("server_key", c.server_key)))
        lines.append(f"{key} = {{ iterations = {c.iterations}, {fields} }}")
    return "\n".join(lines) + "\n"


def _toml_string(text: str) -> str:
    escaped = "".join(c if c.isprintable() and c not in "\"\\" else f"\\U{ord(c):08x}"
                      for c in text)
    return f"\"{escaped}\""


__all__ = ["CREDENTIAL_KEYS", "NO_USERS", "SCRAM_HASHES", "Users", "parse_users",
           "user_entry"]
