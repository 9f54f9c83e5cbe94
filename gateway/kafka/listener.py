"""The Kafka listener: serves Kafka's protocol over a :class:`~gateway.core.contract.Backend`.

Each connection is a :class:`~gateway.kafka.session.KafkaSession`; the server
(:func:`gateway.server.run.open_server`) binds ``listen.kafka`` and tells the listener
where it is bound (:meth:`KafkaListener.bound`): Metadata advertises
``listen.kafka_advertised``, or that address. A listener whose table sets
``sasl_mechanisms`` makes every connection authenticate first (:mod:`gateway.kafka.sasl`).
"""

from __future__ import annotations

from typing import Any, Final

import structlog
import trio

from gateway.auth.guard import AccessGuard
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota, Quotas
from gateway.core.contract import Backend
from gateway.core.metrics import Metrics, RequestCounter
from gateway.core.sections import ConnectionLimits
from gateway.kafka.sasl import SaslGate
from gateway.kafka.services import KafkaServices
from gateway.kafka.session import KafkaSession
from gateway.kafka.settings import KafkaSettings
from gateway.serving.listener import ProtocolListener
from gateway.serving.listening import local_host
from gateway.serving.tls import ListenerTLS

#: Bind addresses meaning "every interface": no client can connect to them as such.
WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", ""})


class KafkaListener(ProtocolListener[KafkaSession]):
    """Accepts Kafka connections and serves each one."""

    protocol = "kafka"
    routine_kinds = frozenset({"eof", "reset", "send_failed", "shutdown", "idle"})
    log = structlog.get_logger("figtank.kafka")

    def __init__(self, backend: Backend, settings: KafkaSettings, metrics: Metrics, *,
                 limits: ConnectionLimits | None = None, name: str | None = None,
                 guard: AccessGuard | None = None, tls: ListenerTLS | None = None,
                 quotas: Quotas | None = None, services: KafkaServices | None = None) -> None:
        super().__init__(backend, metrics, limits=limits, name=name,
                         guard=guard, tls=tls, quotas=quotas)
        #: The listener's settings.
        self.settings = settings
        #: The server-wide Kafka state (:func:`~gateway.server.run.open_server` gives
        #: every Kafka listener the same), or this listener's own.
        self.services = services or KafkaServices.in_memory(settings, metrics)
        self.counter = RequestCounter(metrics, "kafka")
        #: The host and port Metadata names (set by :meth:`bound`).
        self.advertised: tuple[str, int] = ("127.0.0.1", 9092)
        #: The SASL mechanisms connections must authenticate with (empty: no SASL).
        self.sasl_mechanisms = settings.sasl_mechanisms
        #: PLAIN logins derive a key (PBKDF2) in threads: at most this many at once.
        self._sasl_threads = trio.CapacityLimiter(2)

    def bound(self, address: tuple[str, int]) -> None:
        """The listener is bound to ``address``: advertise it, unless the listener named
        kafka has ``listen.kafka_advertised``. Bound to every interface (0.0.0.0, ::),
        each connection is told the address it reached."""
        given = self.settings.advertised if self.name == "kafka" else ""
        if given:
            host, _, port = given.rpartition(":")
            self.advertised = (host.strip("[]"), int(port))
        else:
            self.advertised = address

    def advertised_to(self, stream: trio.abc.Stream) -> tuple[str, int]:
        """The host and port Metadata names to the client of ``stream``."""
        host, port = self.advertised
        if host in WILDCARD_HOSTS:
            host = local_host(stream) or host
        return host, port

    def session(self, stream: trio.abc.Stream,
                log: structlog.typing.FilteringBoundLogger, *,
                principal: Principal, quota: PrincipalQuota | None = None
                ) -> KafkaSession:
        guard = self.guard
        sasl = SaslGate(self.sasl_mechanisms, lambda: guard.users, listener=self.name,
                        failures=self.metrics.sasl_failures, limiter=self._sasl_threads,
                        log=log) if self.sasl_mechanisms else None
        return KafkaSession(stream, backend=self.backend, settings=self.settings,
                            limits=self.limits, metrics=self.metrics, counter=self.counter, log=log,
                            advertised=self.advertised_to(stream), principal=principal,
                            guard=guard, quota=quota, sasl=sasl, quotas=self.quotas,
                            services=self.services)

    def stats(self, session: KafkaSession) -> dict[str, Any]:
        return {"requests": session.requests, "bytes_sent": session.bytes_sent}
