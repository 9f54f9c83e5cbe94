"""The table of protocol listeners: one line each.

:data:`LISTENERS` is what the server (:func:`gateway.server.run.open_server`), the
supervisor of several workers, ``figtank serve``'s line and :class:`ServerInfo`'s
``server.figg``, ``server.tank``... know of the listeners: each line names the listener
(its protocol, and the listener of that name listens where ``listen.<name>`` says), how
people call it, its class, the section of settings it receives and what it is given
from what the server's listeners share. A new listener is a folder in the listeners'
layer (its class and its section) and one line here, with its ``listen.<name>`` setting
and its name in :data:`~gateway.core.config.PROTOCOLS` in ``gateway/core/``.

Every listener is made the same way::

    cls(backend, section.of(settings), metrics, limits=ConnectionLimits.of(settings),
        name=..., guard=..., quotas=..., tls=..., **extras(shared))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.auth.guard import AccessGuard
from gateway.auth.quotas import Quotas
from gateway.core.config import Settings
from gateway.core.contract import Backend
from gateway.core.metrics import Metrics
from gateway.core.sections import ConnectionLimits, Section
from gateway.figg.listener import FiggListener
from gateway.figg.settings import FiggSettings
from gateway.http.idempotency import IdempotencyKeys
from gateway.http.listener import HttpListener
from gateway.http.settings import HttpSettings
from gateway.kafka.listener import KafkaListener
from gateway.kafka.services import KafkaServices
from gateway.kafka.settings import KafkaSettings
from gateway.serving.listener import ProtocolListener
from gateway.serving.tls import ListenerTLS
from gateway.tail.reader import TailReaders
from gateway.tank.listener import TankListener
from gateway.tank.settings import TankSettings

__all__ = ["BY_NAME", "LISTENERS", "ListenerKind", "Shared"]


@dataclass(slots=True)
class Shared:
    """What one server's listeners share beyond the backend and the access policy."""

    #: The server-wide Kafka state (producers, groups, committed offsets).
    services: KafkaServices
    #: The HTTP produces' Idempotency-Key values (None: no HTTP listener).
    idempotency: IdempotencyKeys | None
    #: The listeners made so far, by name.
    listeners: Mapping[str, ProtocolListener[Any]]
    #: The partitions' tail readers, one per partition for every listener's subscribers
    #: at the tail (Figg, SSE, WebSocket); run by the server.
    readers: TailReaders


def _nothing(shared: Shared) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class ListenerKind:
    """One protocol listener the server can run."""

    #: The protocol; the listener of this name listens where ``listen.<name>`` says.
    name: str
    #: How people call it ("Figg on 127.0.0.1:8119").
    shown: str
    #: Its class (generic over its session type: Any of them here).
    listener: Callable[..., ProtocolListener[Any]]
    #: The section of settings it receives.
    section: type[Section]
    #: What else it is given from what the listeners share (keyword arguments).
    extras: Callable[[Shared], dict[str, Any]] = _nothing

    def make(self, backend: Backend, settings: Settings, metrics: Metrics, shared: Shared,
             *, limits: ConnectionLimits, name: str, guard: AccessGuard,
             quotas: Quotas | None, tls: ListenerTLS | None) -> ProtocolListener[Any]:
        """A listener of this kind named ``name``, given its section of ``settings``."""
        return self.listener(backend, self.section.of(settings, name), metrics, limits=limits,
                             name=name, guard=guard, quotas=quotas, tls=tls,
                             **self.extras(shared))


def _share_figg(shared: Shared) -> dict[str, Any]:
    """Figg listeners share one DATA frame cache, and the server's tail readers."""
    first = next((x for x in shared.listeners.values() if isinstance(x, FiggListener)), None)
    readers = {"readers": shared.readers}
    return readers if first is None else {**readers, "share_with": first}


#: Every protocol listener, in the order ``figtank serve`` names them.
LISTENERS: Final = (
    ListenerKind("figg", "Figg", FiggListener, FiggSettings, _share_figg),
    ListenerKind("tank", "Tank", TankListener, TankSettings),
    ListenerKind("kafka", "Kafka", KafkaListener, KafkaSettings,
                 lambda shared: {"services": shared.services}),
    ListenerKind("http", "HTTP", HttpListener, HttpSettings,
                 lambda shared: {"idempotency": shared.idempotency,
                                 "readers": shared.readers}),
)
#: :data:`LISTENERS` by name.
BY_NAME: Final = {kind.name: kind for kind in LISTENERS}
