"""What the HTTP listener is configured with (:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.sections import Section, setting

__all__ = ["HttpSettings"]


@dataclass(frozen=True, slots=True)
class HttpSettings(Section):
    """The HTTP listener's settings, ``http.*`` (beside the :class:`ConnectionLimits`
    every listener holds)."""

    max_body_bytes: int = setting("http.max_body_bytes")
    max_wait_ms: int = setting("http.max_wait_ms")
    heartbeat_secs: float = setting("http.heartbeat_secs")
    subscriber_buffer_bytes: int = setting("http.subscriber_buffer_bytes")
    tail_buffer_bytes: int = setting("http.tail_buffer_bytes")
    cors_origins: tuple[str, ...] = setting("http.cors_origins")
    allowed_hosts: tuple[str, ...] = setting("http.allowed_hosts")
    ws_publish_window: int = setting("http.ws_publish_window")
    idempotency_max_keys: int = setting("http.idempotency_max_keys")
    idempotency_max_bytes: int = setting("http.idempotency_max_bytes")
    idempotency_ttl_secs: float = setting("http.idempotency_ttl_secs")
    jwt_hs256_secret_file: str = setting("http.jwt_hs256_secret_file")
    jwt_rs256_public_key_file: str = setting("http.jwt_rs256_public_key_file")
    jwt_audience: str = setting("http.jwt_audience")
    jwt_issuer: str = setting("http.jwt_issuer")
