"""The upstream cluster as the gateway sees it: its brokers, which one leads each
partition, and the connections to them, opened when first needed.

A broker answers a connection's requests in the order they came, so a Fetch that waits
for data (a long poll) holds back every request sent after it on its connection.
Connections are therefore kept per *lane*: ``main`` (metadata, admin, reads that do not
wait), ``produce`` (the producer's requests), and one lane per tail feed (its long polls),
closed with the feed (:meth:`Cluster.release`).

Metadata comes from any broker (the bootstrap servers until the cluster named its own);
a partition's requests go to its leader. A request that finds the leader moved, or its
connection lost, asks :meth:`Cluster.refresh` and goes again: the caller decides how long
it keeps trying.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import structlog
import trio

from gateway.backend.kafka.wire import BrokerConnection, BrokerLost, Security, open_broker
from protocols.kafka.records import MetadataRequest, MetadataRequestTopic, MetadataResponse
from protocols.kafka.types import ApiKey, ErrorCode

log = structlog.get_logger("figtank.upstream_kafka")

#: Errors that mean "the metadata changed: ask again and retry".
STALE_METADATA: Final = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NOT_CONTROLLER,
})

TopicPartition = tuple[str, int]
#: The lane of metadata, admin requests and reads that do not wait.
MAIN: Final = "main"
#: The producer's lane.
PRODUCE: Final = "produce"


class Cluster:
    """Brokers, leaders and connections; see the module doc. ``nursery`` runs the
    connections' readers."""

    def __init__(self, bootstrap: Sequence[tuple[str, int]], nursery: trio.Nursery, *,
                 security: Security, client_id: str, timeout: float) -> None:
        self.bootstrap = list(bootstrap)
        self._nursery = nursery
        self._security = security
        self._client_id = client_id
        self.timeout = timeout
        #: ``node id -> (host, port)`` as the cluster advertises its brokers.
        self.brokers: dict[int, tuple[str, int]] = {}
        self.leaders: dict[TopicPartition, int] = {}
        self.controller: int = -1
        self._connections: dict[tuple[tuple[str, int], str], BrokerConnection] = {}
        self._connecting: dict[tuple[tuple[str, int], str], trio.Event] = {}
        self._next_bootstrap = 0

    async def connect(self, address: tuple[str, int], lane: str = MAIN) -> BrokerConnection:
        """The connection of ``lane`` to ``address``, opened (once, whoever asks) when
        there is none."""
        key = (address, lane)
        while True:
            connection = self._connections.get(key)
            if connection is not None and connection.lost is None:
                return connection
            waiting = self._connecting.get(key)
            if waiting is None:
                break
            await waiting.wait()
            if key not in self._connections:
                # The attempt we waited for failed: make our own (it raises the reason).
                break
        event = self._connecting[key] = trio.Event()
        try:
            connection = await open_broker(*address, self._nursery, security=self._security,
                                           client_id=self._client_id, timeout=self.timeout)
            self._connections[key] = connection
            return connection
        finally:
            del self._connecting[key]
            event.set()

    def open_connection(self, node_id: int, lane: str = MAIN) -> BrokerConnection | None:
        """The open connection of ``lane`` to broker ``node_id``, None when there is none
        now (:meth:`node` opens one)."""
        address = self.brokers.get(node_id)
        connection = self._connections.get((address, lane)) if address else None
        return connection if connection is not None and connection.lost is None else None

    def open_lanes(self) -> dict[str, float]:
        """Open connections by kind of lane (``main``, ``produce``, ``feed``)."""
        counts = {MAIN: 0.0, PRODUCE: 0.0, "feed": 0.0}
        for (_, lane), connection in list(self._connections.items()):
            if connection.lost is None:
                kind = lane if lane in (MAIN, PRODUCE) else "feed"
                counts[kind] += 1
        return counts

    def release(self, lane: str) -> None:
        """Close the connections of ``lane`` (a feed that stopped)."""
        for key in [k for k in self._connections if k[1] == lane]:
            self._connections.pop(key).close("its lane was released")

    async def any_broker(self) -> BrokerConnection:
        """A connection to some broker: one already open, else the known brokers and the
        bootstrap servers in turn (the last failure raised when none answers)."""
        for (_, lane), connection in self._connections.items():
            if connection.lost is None and lane == MAIN:
                return connection
        candidates = list(dict.fromkeys([*self.brokers.values(), *self.bootstrap]))
        failure: BrokerLost | None = None
        for i in range(len(candidates)):
            address = candidates[(self._next_bootstrap + i) % len(candidates)]
            try:
                return await self.connect(address)
            except BrokerLost as exc:
                failure = exc
        self._next_bootstrap += 1
        raise failure or BrokerLost("no bootstrap servers")

    async def node(self, node_id: int, lane: str = MAIN) -> BrokerConnection:
        """The connection of ``lane`` to broker ``node_id`` (:class:`BrokerLost` for one
        not known)."""
        address = self.brokers.get(node_id)
        if address is None:
            raise BrokerLost(f"broker {node_id} is not in the cluster's metadata")
        return await self.connect(address, lane)

    async def leader(self, topic: str, partition: int, lane: str = MAIN) -> BrokerConnection:
        """The connection of ``lane`` to the leader of ``topic``/``partition`` (metadata
        asked first when the leader is not known)."""
        node = self.leaders.get((topic, partition))
        if node is None or node < 0:
            await self.metadata([topic])
            node = self.leaders.get((topic, partition))
            if node is None or node < 0:
                raise BrokerLost(f"no leader for {topic}/{partition}")
        return await self.node(node, lane)

    async def metadata(self, topics: Sequence[str] | None) -> MetadataResponse:
        """The cluster's Metadata for ``topics`` (None: all; []: none, the brokers only),
        never creating a topic; what it says about brokers and leaders is kept."""
        connection = await self.any_broker()
        version = connection.version(ApiKey.METADATA)
        asked = None if topics is None else [MetadataRequestTopic(name=t) for t in topics]
        if asked is None and version == 0:
            asked = []  # version 0 reads an empty list as "all topics"
        answer = await connection.call(ApiKey.METADATA, MetadataRequest(
            topics=asked, allow_auto_topic_creation=False), version=version)
        self.learn(answer)
        return answer

    def learn(self, answer: MetadataResponse) -> None:
        """Keep what a Metadata answer says of brokers, the controller and leaders."""
        if answer.brokers:
            self.brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
        self.controller = answer.controller_id
        for topic in answer.topics:
            if topic.error_code or topic.name is None:
                continue
            for p in topic.partitions:
                self.leaders[(topic.name, p.partition_index)] = p.leader_id

    def forget(self, topic: str, partition: int) -> None:
        """The leader of ``topic``/``partition`` moved or is unknown: ask next time."""
        self.leaders.pop((topic, partition), None)

    def close(self) -> None:
        """Close every connection."""
        for connection in self._connections.values():
            connection.close("the gateway is stopping")
