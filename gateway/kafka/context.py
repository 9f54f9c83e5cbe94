"""What a Kafka request handler may use: the backend, the connection's access and the
listener's server-wide state, bundled once per connection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from gateway.auth.guard import ConnectionAccess
from gateway.auth.principal import Principal
from gateway.backend.contract import Backend
from gateway.kafka.idempotence import ProducerStates

if TYPE_CHECKING:
    from gateway.kafka.groups.coordinator import GroupCoordinator


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
    #: The server's idempotent producers (ids and sequence state), shared by every
    #: connection of every Kafka listener.
    producers: ProducerStates
    #: The server's consumer group coordinator (None: groups not served).
    groups: GroupCoordinator | None = None
    #: The client id of the connection's latest request (Kafka clients keep one).
    client_id: str = ""
    #: The client's address, as DescribeGroups shows it (``/127.0.0.1``).
    client_host: str = ""
