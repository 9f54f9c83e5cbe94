"""The quota buckets an HTTP request counts against.

A connection holds the buckets of its own principal (``listener:http``, or its client
certificate's subject); a request with a bearer token acts as the token's user, whose
``[[quota]]`` entry may differ: :func:`quota_of` holds that principal's buckets (shared
with all its connections, :class:`~gateway.auth.quotas.Quotas`) while the request or
stream runs.

What counts, as on the other listeners: bytes in are a produce's body; bytes out are the
messages sent (a fetch's answer body, each SSE event block, each WebSocket ``data``
frame). Data waits for the bytes-out debt to be paid (``figtank_quota_delay_seconds
{direction="out"}``); nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota
from gateway.http.session import HttpSession


@contextmanager
def quota_of(session: HttpSession, principal: Principal) -> Iterator[PrincipalQuota | None]:
    """The buckets of ``principal`` for the block (None: no quotas on this server)."""
    quotas = session.listener.quotas
    if quotas is None or principal == session.principal:
        yield session.quota
        return
    quota = quotas.acquire(principal)
    try:
        yield quota
    finally:
        quotas.release(quota)


def owes(quota: PrincipalQuota | None) -> bool:
    """Whether data for ``quota``'s principal must wait now (its bytes-out debt)."""
    return quota is not None and quota.out_limited and quota.out_in_debt()


def took_out(quota: PrincipalQuota | None, size: int) -> None:
    """``size`` bytes of messages were queued for the principal."""
    if quota is not None and quota.out_limited:
        quota.took_out(size)


async def wait_out(quota: PrincipalQuota | None) -> None:
    """Wait until the principal's bytes-out debt is paid (at once without one)."""
    if quota is not None and quota.out_limited:
        await quota.wait_out()
