"""A SCRAM client (RFC 5802) for the raw tests, written from the RFC, independent of the
server's code."""

from __future__ import annotations

import base64
import hashlib
import hmac


class ScramClient:
    """Makes the client's two messages and checks the server's signature."""

    def __init__(self, mechanism: str, user: str, password: str,
                 nonce: str = "fyko+d2lbbFgONRv9qkxdawL") -> None:
        self.hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.password = password.encode()
        self.first_bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
        self.nonce = nonce
        self.auth_message = b""
        self.salted = b""

    def first(self) -> bytes:
        return ("n,," + self.first_bare).encode()

    def final(self, server_first: bytes, nonce_prefix: str = "") -> bytes:
        """The client-final message; ``nonce_prefix`` goes before the combined nonce
        (librdkafka before 2.6.1 repeats its own nonce there)."""
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce)
        self.salted = hashlib.pbkdf2_hmac(self.hash, self.password,
                                          base64.b64decode(attrs["s"]), int(attrs["i"]))
        without_proof = f"c=biws,r={nonce_prefix}{attrs['r']}"
        self.auth_message = ",".join((self.first_bare, server_first.decode(),
                                      without_proof)).encode()
        client_key = hmac.digest(self.salted, b"Client Key", self.hash)
        stored_key = hashlib.new(self.hash, client_key).digest()
        signature = hmac.digest(stored_key, self.auth_message, self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        server_key = hmac.digest(self.salted, b"Server Key", self.hash)
        expected = hmac.digest(server_key, self.auth_message, self.hash)
        return server_final == b"v=" + base64.b64encode(expected)
