"""Before a produce under an access policy: which of its topics must be looked up, so that
one the backend would auto-create is refused to a principal without ``create`` (shared by
the Tank and Kafka listeners)."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.core.contract import Backend


def topics_to_look_up(access: ConnectionAccess, topics: Iterable[str],
                      auto_create: bool) -> set[str]:
    """Those of ``topics`` whose existence must be checked first: the principal may
    publish to them but not create them, and the backend would."""
    if access.open:
        return set()
    return {name for name in topics
            if access.must_look_up(name, auto_create) and access.may(name, Operation.PUBLISH)}


async def look_up(access: ConnectionAccess, backend: Backend, topics: set[str]) -> None:
    """Record which of ``topics`` exist (:meth:`ConnectionAccess.seen`)."""
    for topic in topics:
        if await backend.discover_partitions(topic) is not None:
            access.seen(topic)
