"""Bearer tokens to principals on the HTTP listener: static tokens of the policy file
(``[[token]]``, :mod:`gateway.auth.tokens`) and JWT signed with HS256 or RS256
(``http.jwt_hs256_secret_file``, ``http.jwt_rs256_public_key_file``; PyJWT, the ``jwt``
extra, imported only when one is configured).

A token acts as ``user:NAME`` (a static token's ``user``, a JWT's ``sub``); what that user
may do is the policy's rules for it. A JWT must be valid now (``exp`` and ``nbf`` are
checked when present) and carry ``http.jwt_audience`` / ``http.jwt_issuer`` when those are
set. A token that is not valid is 401 with ``WWW-Authenticate: Bearer realm="figtank",
error="invalid_token", error_description="..."`` (RFC 6750 §3); the decisions on valid
JWTs are kept (at most :data:`CACHE_ENTRIES`, until they expire), so a stream of requests
costs one check.

:meth:`Tokens.reload` (SIGHUP) reads the key files again: a token signed with a key no
longer there is refused from then on (the kept decisions are dropped), and the listener's
open streams are looked at again (:mod:`gateway.http.revocation`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

from gateway.auth.guard import AccessGuard
from gateway.auth.principal import Principal
from gateway.core.config import ConfigError
from gateway.extras import require
from gateway.http.challenge import invalid_token_challenge
from gateway.http.request import HttpError, Request
from gateway.http.settings import HttpSettings

CACHE_ENTRIES: Final = 4096


def _invalid(why: str) -> HttpError:
    return HttpError(401, "invalid_token", why, [invalid_token_challenge(why)])


class Tokens:
    """What bearer tokens the listener accepts."""

    def __init__(self, guard: AccessGuard, settings: HttpSettings) -> None:
        self._guard = guard
        self._files = {algorithm: (key, read) for algorithm, key, read in (
            ("HS256", "http.jwt_hs256_secret_file", settings.jwt_hs256_secret_file),
            ("RS256", "http.jwt_rs256_public_key_file",
             settings.jwt_rs256_public_key_file)) if read}
        self._keys: dict[str, Any] = self._read_keys()
        self._jwt = require("jwt", extra="jwt", purpose="JWT bearer tokens") if (
            self._keys) else None
        self._audience = settings.jwt_audience or None
        self._issuer = settings.jwt_issuer or None
        #: token -> (user, kept until, its ``exp`` or None)
        self._cache: dict[str, tuple[str, float, float | None]] = {}

    @property
    def has_keys(self) -> bool:
        """Whether JWT keys are configured (and so can be reloaded)."""
        return bool(self._files)

    def _read_keys(self) -> dict[str, Any]:
        keys = {}
        for algorithm, (key, read) in self._files.items():
            try:
                keys[algorithm] = Path(read).read_bytes().strip()
            except OSError as exc:
                raise ConfigError(f"{key}: cannot read {read}: {exc.strerror}") from None
            if not keys[algorithm]:
                raise ConfigError(f"{key}: {read} is empty")
        return keys

    def reload(self) -> None:
        """Read the key files again (SIGHUP); a file that can not be read keeps the keys
        in force (``ValueError``, one line naming the setting)."""
        self._keys = self._read_keys()
        self._cache.clear()

    def user_now(self, token: str) -> str | None:
        """The user ``token`` names under the tokens and keys in force now (no kept
        decision), or None: what an open stream is checked against on reload."""
        user = self._guard.tokens.user_of(token)
        if user is None and self._jwt is not None and token.count(".") == 2:
            try:
                user = self._jwt_user(token, cached=False)
            except HttpError:
                return None
        return user

    def expires_at(self, token: str) -> float | None:
        """When ``token`` stops being valid (its ``exp``, seconds since the epoch), or None
        for a token that does not expire (a static token, a JWT without ``exp``). Asked
        of a token already admitted, so its signature is not checked again."""
        if self._jwt is None or token.count(".") != 2 or (
                self._guard.tokens.user_of(token) is not None):
            return None
        kept = self._cache.get(token)
        if kept is not None:
            return kept[2]
        try:
            claims = self._jwt.decode(token, options={"verify_signature": False})
        except self._jwt.PyJWTError:
            return None
        return _expiry(claims)

    def principal(self, token: str, connection: Principal, request: Request) -> Principal:
        """The principal ``token`` names; 401 when it names none."""
        user = self._guard.tokens.user_of(token)
        if user is None and self._jwt is not None and token.count(".") == 2:
            user = self._jwt_user(token)
        if user is None:
            raise _invalid("the bearer token is not valid here")
        return Principal(connection.listener, connection.identity, user)

    def _jwt_user(self, token: str, *, cached: bool = True) -> str:
        kept = self._cache.get(token) if cached else None
        now = time.time()
        if kept is not None and kept[1] > now:
            return kept[0]
        jwt = self._jwt
        assert jwt is not None
        try:
            algorithm = jwt.get_unverified_header(token).get("alg")
            key = self._keys.get(algorithm)
            if key is None:
                raise _invalid(f"JWT algorithm {algorithm!r} is not accepted "
                               f"(accepted: {', '.join(self._keys)})")
            claims = jwt.decode(token, key, algorithms=[algorithm], audience=self._audience,
                                issuer=self._issuer,
                                options={"verify_aud": self._audience is not None})
        except jwt.PyJWTError as exc:
            raise _invalid(f"JWT not valid: {exc}") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise _invalid("JWT has no sub claim")
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        expires = _expiry(claims)
        self._cache[token] = (subject, now + 60 if expires is None else expires, expires)
        return subject


def _expiry(claims: dict[str, Any]) -> float | None:
    expires = claims.get("exp")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        return float(expires)
    return None
