"""The server-wide state of the Kafka listeners, made once per server and shared by
every Kafka listener and connection: idempotent producers, the group coordinator, the
groups' committed offsets and the codecs fetched batches are served in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from gateway.core.metrics import Metrics
from gateway.kafka.fetch_codecs import FetchCompression
from gateway.kafka.groups.coordinator import GroupCoordinator
from gateway.kafka.groups.membership import MembershipCheck, NoMembers
from gateway.kafka.groups.offsets import OffsetStore
from gateway.kafka.idempotence import ProducerStates
from gateway.kafka.settings import KafkaSettings

#: Why consumer groups are refused in upstream-Kafka mode (the clients' error message).
NO_GROUPS_UPSTREAM: Final = (
    "figtank in upstream-Kafka mode does not coordinate consumer groups (a gateway keeps "
    "no group state); assign partitions and keep positions in the application, or join "
    "the group at the upstream cluster")

#: Why consumer groups are refused by a gateway of several workers (``server.workers``).
NO_GROUPS_WORKERS: Final = (
    "figtank with several workers does not coordinate consumer groups (each worker would "
    "keep groups and committed offsets of its own); assign partitions and keep positions "
    "in the application, or run one worker")


@dataclass(slots=True)
class KafkaServices:
    """What every Kafka connection of one server shares."""

    #: Idempotent producers' ids and sequence state.
    producers: ProducerStates
    #: Committed offsets (durable, or in memory only).
    offsets: OffsetStore
    #: The consumer group coordinator (None: group membership requests are not served
    #: and only standalone commits are taken).
    groups: GroupCoordinator | None = None
    #: Set: every group request is refused with GROUP_AUTHORIZATION_FAILED, this the why
    #: (upstream-Kafka mode: no group state on a gateway).
    groups_refused: str | None = None
    #: The codec of each topic's fetched batches (``kafka.fetch_compression``).
    fetch_compression: FetchCompression = field(default_factory=FetchCompression)

    @property
    def membership(self) -> MembershipCheck:
        """Who may commit for a group: the coordinator, or a stand-in with no members."""
        if self.groups is not None:
            return self.groups
        return NoMembers(self.offsets.has_group)

    @classmethod
    def in_memory(cls, settings: KafkaSettings, metrics: Metrics) -> KafkaServices:
        """A listener's own state when it is made outside a server (no coordinator, the
        offsets in memory)."""
        return cls(ProducerStates(settings.max_producer_states, metrics), OffsetStore(None),
                   fetch_compression=fetch_compression(settings))


def fetch_compression(settings: KafkaSettings) -> FetchCompression:
    """The fetch codecs ``settings`` choose (``kafka.fetch_compression`` and
    ``kafka.fetch_compression_topics``)."""
    return FetchCompression(settings.fetch_compression, settings.fetch_compression_topics)
