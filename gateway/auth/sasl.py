"""SASL on the server side, sans I/O: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802,
RFC 7677), as Kafka clients speak them.

A user's secret is kept as a :class:`ScramCredential` (salt, iteration count, StoredKey,
ServerKey: never the password). SCRAM proves the password without sending it; PLAIN sends
it (hence only over TLS) and is checked against the same credential by deriving the
StoredKey from it (PBKDF2, costly on purpose: run it off the event loop).

An exchange is a :class:`SaslServer` (:func:`server` makes one): feed it each client
token with :meth:`SaslServer.step`, send back what it returns; when
:attr:`SaslServer.done` the client is :attr:`SaslServer.user`. Any failure is a
:class:`SaslFailed` with a message safe to send to the client (it does not tell a wrong
password from an unknown user).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

#: The mechanisms this module serves, by their SASL names.
SCRAM_HASHES: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS: Final = ("PLAIN", *SCRAM_HASHES)
#: Fewest PBKDF2 iterations a SCRAM credential may have (RFC 7677 section 4).
MIN_ITERATIONS: Final = 4096
#: Longest user name accepted (Kafka's SCRAM allows any; a bound keeps log lines short).
MAX_USER_CHARS: Final = 256


class SaslFailed(Exception):
    """Authentication failed; ``str()`` is the message for the client and the log.
    ``detail`` is what only the log says, which the client must not learn: no such user,
    no credential for this mechanism, or a wrong password."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail



@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps of a password for one hash (RFC 5802 section 3)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_credential(password: str, mechanism: str, iterations: int = MIN_ITERATIONS,
                     salt: bytes | None = None) -> ScramCredential:
    """The credential of ``password`` for ``mechanism`` (SCRAM-SHA-256 or -512)."""
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"iterations must be at least {MIN_ITERATIONS}, got {iterations}")
    name = SCRAM_HASHES[mechanism]
    salt = secrets.token_bytes(24) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(name, _saslprep(password), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", name)
    return ScramCredential(salt, iterations, hashlib.new(name, client_key).digest(),
                           hmac.digest(salted, b"Server Key", name))


def _saslprep(password: str) -> bytes:
    # Full SASLprep (RFC 4013) is not done: passwords are compared as their UTF-8 bytes,
    # as Kafka's Java clients send them.
    return password.encode()


#: A user's credentials by mechanism name, as the access policy's ``[[user]]`` gives them.
UserCredentials = Mapping[str, ScramCredential]
#: Looks a user's credentials up (None: no such user).
Lookup = Callable[[str], UserCredentials | None]


class SaslServer:
    """One authentication exchange; see the module doc."""

    mechanism: str = ""

    def __init__(self) -> None:
        #: The authenticated user, once :attr:`done`.
        self.user: str | None = None
        #: The user name the client claimed (for log lines, also after a failure).
        self.claimed: str | None = None
        self.done = False

    def step(self, token: bytes) -> bytes:
        """Take the client's next token; the server's answer. Raises :class:`SaslFailed`."""
        raise NotImplementedError


def server(mechanism: str, lookup: Lookup, *, nonce: str | None = None) -> SaslServer:
    """The server side of ``mechanism`` (one of :data:`MECHANISMS`) checking against
    ``lookup``; ``nonce`` fixes SCRAM's server nonce (tests), else a random one."""
    if mechanism == "PLAIN":
        return PlainServer(lookup)
    if mechanism in SCRAM_HASHES:
        return ScramServer(mechanism, lookup, nonce=nonce)
    raise ValueError(f"unsupported SASL mechanism {mechanism!r}")


def _why(user: str, credentials: UserCredentials | None, mechanism: str) -> str:
    """Why ``user`` could not log in with ``mechanism`` (for the log only)."""
    if not credentials:
        return f"no user {user!r}"
    if mechanism not in credentials:
        return (f"user {user!r} has no {mechanism} credential (it has "
                f"{', '.join(sorted(credentials))})")
    return f"wrong password for user {user!r}"

class PlainServer(SaslServer):
    """PLAIN: one token ``authzid NUL authcid NUL password``, an empty answer."""

    mechanism = "PLAIN"

    def __init__(self, lookup: Lookup) -> None:
        super().__init__()
        self._lookup = lookup

    def step(self, token: bytes) -> bytes:
        if self.done:
            raise SaslFailed("PLAIN: authentication is already complete")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailed("PLAIN: malformed token (expected authzid NUL user NUL "
                             "password)")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise SaslFailed("PLAIN: the token is not UTF-8") from None
        if not user or len(user) > MAX_USER_CHARS:
            raise SaslFailed("PLAIN: empty or too long user name")
        self.claimed = user
        if authzid and authzid != user:
            raise SaslFailed("PLAIN: an authorization id other than the user is not "
                             "supported")
        credentials = self._lookup(user) or {}
        mechanism = next((m for m in SCRAM_HASHES if m in credentials), "SCRAM-SHA-256")
        known = credentials.get(mechanism)
        # Derive for an unknown user as well: the answer takes as long either way.
        credential = known or _decoy(user, mechanism)
        derived = scram_credential(password, mechanism, credential.iterations,
                                   credential.salt)
        if not (hmac.compare_digest(derived.stored_key, credential.stored_key)
                and known is not None):
            raise SaslFailed("Authentication failed: Invalid username or password",
                             _why(user, credentials, mechanism))
        self.user = user
        self.done = True
        return b""


class ScramServer(SaslServer):
    """SCRAM (RFC 5802) without channel binding: client-first, server-first, client-final,
    server-final."""

    def __init__(self, mechanism: str, lookup: Lookup, *, nonce: str | None = None) -> None:
        super().__init__()
        self.mechanism = mechanism
        self._hash = SCRAM_HASHES[mechanism]
        self._lookup = lookup
        self._nonce = nonce if nonce is not None else secrets.token_urlsafe(24)
        self._state = "client-first"
        self._credential: ScramCredential | None = None
        self._known = False
        self._why = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._client_nonce = ""

    def step(self, token: bytes) -> bytes:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise SaslFailed(f"{self.mechanism}: the message is not UTF-8") from None
        if self._state == "client-first":
            return self._client_first(text).encode()
        if self._state == "client-final":
            return self._client_final(text).encode()
        raise SaslFailed(f"{self.mechanism}: authentication is already complete")

    def _fail(self, what: str) -> SaslFailed:
        self._state = "failed"
        return SaslFailed(f"{self.mechanism}: {what}")

    def _client_first(self, text: str) -> str:
        # gs2-header: cbind-flag "," [authzid] "," ; then client-first-message-bare.
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise self._fail("malformed client-first message")
        flag, authzid, bare = parts
        if flag == "p" or flag.startswith("p="):
            raise self._fail("channel binding is not supported")
        if flag not in ("n", "y"):
            raise self._fail("malformed client-first message (gs2 flag)")
        if authzid and not authzid.startswith("a="):
            raise self._fail("malformed client-first message (authzid)")
        attributes = bare.split(",")
        if len(attributes) < 2 or not attributes[0].startswith("n=") \
                or not attributes[1].startswith("r="):
            raise self._fail("malformed client-first message (expected n=USER,r=NONCE)")
        if any(a.startswith("m=") for a in attributes):
            raise self._fail("mandatory extensions are not supported")
        user = _unescape(attributes[0][2:])
        if user is None or not user or len(user) > MAX_USER_CHARS:
            raise self._fail("malformed user name")
        self.claimed = user
        if authzid and _unescape(authzid[2:]) != user:
            raise self._fail("an authorization id other than the user is not supported")
        client_nonce = attributes[1][2:]
        if not client_nonce or not all(0x21 <= ord(c) <= 0x7E and c != ","
                                       for c in client_nonce):
            raise self._fail("malformed client nonce")
        credentials = self._lookup(user)
        credential = credentials.get(self.mechanism) if credentials else None
        self._known = credential is not None
        self._why = _why(user, credentials, self.mechanism)
        self._credential = credential or _decoy(user, self.mechanism)
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._client_nonce = client_nonce
        self._nonce = client_nonce + self._nonce
        salt = base64.b64encode(self._credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self._credential.iterations}"
        self._state = "client-final"
        return self._server_first

    def _client_final(self, text: str) -> str:
        credential = self._credential
        assert credential is not None
        attributes = text.split(",")
        if len(attributes) < 3 or not attributes[0].startswith("c=") \
                or not attributes[1].startswith("r=") or not attributes[-1].startswith("p="):
            raise self._fail("malformed client-final message (expected c=,r=,...,p=)")
        try:
            binding = base64.b64decode(attributes[0][2:], validate=True)
            proof = base64.b64decode(attributes[-1][2:], validate=True)
        except (binascii.Error, ValueError):
            raise self._fail("malformed client-final message (base64)") from None
        if binding != self._gs2_header.encode():
            raise self._fail("channel binding data does not match the gs2 header")
        # librdkafka before 2.6.1 sends its own nonce again before the combined one
        # (confluentinc/librdkafka#4895, since v0.0.99: kcat 1.7.1's 2.0.2 among them);
        # Kafka 3.8.1 accepts any prefix (endsWith), this only that one.
        if attributes[1][2:] not in (self._nonce, self._client_nonce + self._nonce):
            raise self._fail("the nonce does not match")
        without_proof = text[:text.rindex(",p=")]
        message = ",".join((self._client_first_bare, self._server_first,
                            without_proof)).encode()
        signature = hmac.digest(credential.stored_key, message, self._hash)
        if len(proof) != len(signature):
            raise self._fail("malformed client proof (wrong length)")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        stored = hashlib.new(self._hash, client_key).digest()
        if not (hmac.compare_digest(stored, credential.stored_key) and self._known):
            self._state = "failed"
            raise SaslFailed("Authentication failed during authentication due to invalid "
                             f"credentials with SASL mechanism {self.mechanism}", self._why)
        server_signature = hmac.digest(credential.server_key, message, self._hash)
        self._state = "done"
        self.user = self.claimed
        self.done = True
        return "v=" + base64.b64encode(server_signature).decode()


def _unescape(name: str) -> str | None:
    """A SCRAM saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is
    malformed (None)."""
    out = name.replace("=2C", ",").replace("=3D", "=")
    return None if "=" in name.replace("=2C", "").replace("=3D", "") else out


_DECOY_KEY: Final = secrets.token_bytes(32)


def _decoy(user: str, mechanism: str) -> ScramCredential:
    """A made-up credential for an unknown user: same salt every time for a name, keys
    nobody can match, so an unknown user looks like a wrong password."""
    name = SCRAM_HASHES[mechanism]
    salt = hmac.digest(_DECOY_KEY, f"{mechanism}\0{user}".encode(), "sha256")[:24]
    return ScramCredential(salt, MIN_ITERATIONS, secrets.token_bytes(hashlib.new(name)
                                                                     .digest_size),
                           b"")
