"""The identity a connection acts as.

The Figg and Tank protocols have no login message, so a connection's identity comes
from how it arrived: the subject of its TLS client certificate on a mutual-TLS listener,
else the listener itself (an operator gives each network its own listener, e.g. a
read-only Tank listener for analytics). A Kafka connection on a SASL listener becomes its
SASL ``user`` once it has authenticated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    """A connection's identity: the ``listener`` it came through (its configured name,
    e.g. ``"tank"``, ``"figg"``, ``"analytics"``) and, on a mutual-TLS listener, the
    ``identity`` of its client certificate (the subject, as ``"CN=alice,O=acme"``)."""

    listener: str
    identity: str | None = None
    #: The SASL user the connection authenticated as (a policy names it ``user:NAME``).
    user: str | None = None

    @property
    def name(self) -> str:
        """How log lines and metrics name it: ``user:<name>`` for a SASL user, else the
        certificate identity, else ``listener:<name>``."""
        if self.user is not None:
            return f"user:{self.user}"
        return self.identity if self.identity is not None else f"listener:{self.listener}"
