"""What the backends in front of an upstream share (the bridge's Tank broker, the upstream
Kafka cluster: :mod:`gateway.backend.bridge`, :mod:`gateway.backend.kafka`).

Neither keeps a log of its own, so both answer the calls about one the same way
(:class:`Forwarding`), and both check a produce batch here before it goes upstream, so a
bad one fails only its own batch and never reaches the upstream:
:func:`refuse_topic_name` first, then each backend's own checks of the partition and the
sequence numbers, then :func:`checked_bundle`. A topic to create upstream is checked with
:func:`valid_new_topic`.
"""

from __future__ import annotations

from typing import Final

from gateway.core.contract import ProduceBatch, ProduceCode, ProduceOutcome
from protocols.errors import ProtocolError
from protocols.tank.bundle import BundleInfo, parse_bundle_header, validate_bundle
from protocols.topics import MAX_PARTITIONS, is_valid_topic_name

__all__ = ["DEFAULT_WAIT_SECS", "Forwarding", "checked_bundle", "refuse_topic_name",
           "valid_new_topic"]

#: How long a produce or admin call waits for an absent upstream.
DEFAULT_WAIT_SECS: Final = 5.0


class Forwarding:
    """The part of :class:`~gateway.core.contract.Backend` a backend in front of an
    upstream answers as every other one does."""

    #: In front of an upstream, which may go away (the backend's ``unavailable()``).
    has_upstream = True

    def topic_configs(self) -> None:
        """None: the upstream keeps its topics' settings."""
        return None

    def fast_appender(self, topic: str, partition: int) -> None:
        """No one-pass appends: every Produce goes through ``produce_nowait``."""
        return None


def refuse_topic_name(batch: ProduceBatch) -> ProduceOutcome | None:
    """The outcome refusing ``batch`` for its topic's name (not a valid Tank topic name),
    or None."""
    if is_valid_topic_name(batch.topic):
        return None
    return ProduceOutcome(ProduceCode.UNKNOWN_TOPIC, reason=f"invalid topic name {batch.topic!r}")


def checked_bundle(batch: ProduceBatch, max_bundle_bytes: int, *,
                   whole: bool = True) -> ProduceOutcome | BundleInfo:
    """``batch``'s bundle's header (the gateway's own, when it built the batch, else read
    and every message checked), or the outcome refusing a bundle over ``max_bundle_bytes``
    or not well formed (I/O fault, as the embedded store answers them). ``whole=False``:
    the header only (for a caller that reads every message itself afterwards)."""
    if len(batch.bundle) > max_bundle_bytes:
        return ProduceOutcome(ProduceCode.IO_FAULT, reason=(
            f"bundle of {len(batch.bundle)} bytes is over {max_bundle_bytes}"))
    if batch.info is not None:  # built by the gateway itself
        return batch.info
    try:
        return validate_bundle(batch.bundle) if whole else parse_bundle_header(batch.bundle)
    except ProtocolError as exc:
        return ProduceOutcome(ProduceCode.IO_FAULT, reason=f"invalid bundle: {exc}")


def valid_new_topic(name: str, partitions: int) -> bool:
    """Whether a topic ``name`` of ``partitions`` partitions may be asked of the upstream
    (else its creation is answered INVALID)."""
    return is_valid_topic_name(name) and 0 < partitions <= MAX_PARTITIONS
