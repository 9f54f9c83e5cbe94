"""What a Kafka request handler may use: the backend, the connection's access and the
server-wide Kafka state, bundled per connection (a new bundle when a request's client id
differs from the previous one's: a handler task keeps the one it was started with)."""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from gateway.auth.guard import ConnectionAccess
from gateway.auth.principal import Principal
from gateway.core.contract import Backend
from gateway.kafka.groups.coordinator import GroupCoordinator
from gateway.kafka.groups.membership import MembershipCheck
from gateway.kafka.groups.offsets import OffsetStore
from gateway.kafka.idempotence import ProducerStates
from gateway.kafka.services import KafkaServices
from gateway.logevery import LogEvery


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
    #: The server-wide Kafka state.
    services: KafkaServices
    #: The client id of the request served with this context.
    client_id: str = ""
    #: The client's address, as DescribeGroups shows it (``/127.0.0.1``).
    client_host: str = ""
    #: How often the connection's refusal lines may be logged (shared by every context
    #: of the connection).
    refusals: LogEvery = field(default_factory=LogEvery)

    def refused(self, event: str, **fields: object) -> None:
        """Log a refused request as ``event``: the first of each kind on a connection,
        then at most one a minute, the next line counting those held back
        (``suppressed``), so that a client repeating a bad request can not flood the
        log."""
        held = self.refusals.due(event)
        if held is not None:
            self.log.info(event, **fields, **({"suppressed": held} if held else {}))

    @property
    def producers(self) -> ProducerStates:
        """The server's idempotent producers."""
        return self.services.producers

    @property
    def groups(self) -> GroupCoordinator | None:
        """The server's group coordinator (None: groups not served)."""
        return self.services.groups

    @property
    def offsets(self) -> OffsetStore:
        """The server's committed offsets."""
        return self.services.offsets

    @property
    def membership(self) -> MembershipCheck:
        """Who may commit for a group."""
        return self.services.membership
