"""What a Kafka request handler may use: the backend, the connection's access and the
listener's server-wide state, bundled once per connection."""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from gateway.auth.guard import ConnectionAccess
from gateway.auth.principal import Principal
from gateway.backend.contract import Backend
from gateway.kafka.groups.membership import MembershipCheck, NoMembers
from gateway.kafka.groups.offsets import OffsetStore


@dataclass(slots=True)
class RequestContext:
    """One connection's view of the server, passed to every handler of
    :data:`gateway.kafka.handlers.HANDLERS`."""

    backend: Backend
    #: The connection's permissions (the access policy applied to :attr:`principal`).
    access: ConnectionAccess
    #: Who the connection acts as.
    principal: Principal
    #: The host and port Metadata and FindCoordinator name.
    advertised: tuple[str, int]
    log: structlog.typing.FilteringBoundLogger
    #: The server's committed offsets (shared by every Kafka listener).
    offsets: OffsetStore = field(default_factory=lambda: OffsetStore(None))
    #: Who may commit for a group: the group coordinator (a stand-in without members
    #: until one is given).
    membership: MembershipCheck = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.membership is None:
            offsets = self.offsets
            self.membership = NoMembers(offsets.has_group)
