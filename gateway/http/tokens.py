"""Bearer tokens to principals: static tokens of the policy file, and JWT.

Placeholder until token access is configured: every token is refused (401).
"""

from __future__ import annotations

from gateway.auth.principal import Principal
from gateway.http.request import HttpError, Request


class Tokens:
    """What bearer tokens the listener accepts."""

    def principal(self, token: str, connection: Principal, request: Request) -> Principal:
        """The principal ``token`` names; 401 when it names none."""
        raise HttpError(401, "invalid_token", "this listener accepts no bearer token",
                        [(b"www-authenticate", b'Bearer error="invalid_token"')])
