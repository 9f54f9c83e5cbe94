"""A blocking face of :class:`~gateway.client.tank.TankClient`, for scripts and Spark.

::

    with BlockingTankClient("127.0.0.1", 11011) as client:
        client.produce({("orders", 0): [b"hello"]})
        result = client.consume("orders", 0, 1)

A background thread runs trio and the async client (:class:`~gateway.client._portal.TrioPortal`);
each call crosses over and blocks until answered. Calls from several threads are
pipelined on the one connection.

Made for Spark executors: the client is built from ``host``/``port`` and keyword options
only, keeps no global state, and pickles as those values. An unpickled copy (or a copy in
a forked worker) connects on its first call. After a lost connection the failing call
raises :class:`~gateway.client.errors.ConnectionLost` and the next call reconnects.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from gateway.client._portal import PortalClosed, TrioPortal
from gateway.client.errors import ClientClosed
from gateway.client.tank import (
    DEFAULT_FETCH_SIZE,
    BrokerStatus,
    Codec,
    ConsumeResult,
    MessageLike,
    PartitionBounds,
    TankClient,
    TankOptions,
    TopicInfo,
    TopicPartition,
)

__all__ = ["BlockingTankClient"]

T = TypeVar("T")


class BlockingTankClient:
    """The async Tank client behind blocking calls; close it (or use ``with``).

    ``options`` are :class:`~gateway.client.tank.TankClient`'s keyword arguments
    (``client_id``, ``connect_timeout``, ``request_timeout``, ``max_frame_size``).
    ``connect=False`` defers connecting to the first call.
    """

    def __init__(self, host: str, port: int, *, connect: bool = True,
                 **options: Unpack[TankOptions]) -> None:
        self.host = host
        self.port = port
        self.options = options
        self._lock = threading.Lock()
        self._portal: TrioPortal | None = None
        self._client: TankClient | None = None
        self._closed = False
        if connect:
            self.connect()

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (self.host, self.port, self.options)

    @property
    def connected(self) -> bool:
        portal, client = self._portal, self._client
        return (portal is not None and portal.owned_by_this_process and client is not None
                and client.connected)

    def connect(self) -> None:
        """Connect now unless connected (waits for the broker's Ping)."""
        with self._lock:
            if self._closed:
                raise ClientClosed("the Tank client is closed")
            if self.connected:
                return
            self._drop()
            portal = TrioPortal("tank-client")
            client = TankClient(self.host, self.port, **self.options)
            try:
                portal.call(portal.nursery.start, client.run)
            except BaseException:
                portal.close()
                raise
            self._portal, self._client = portal, client

    def _drop(self) -> None:
        portal, self._portal, self._client = self._portal, None, None
        if portal is not None:
            portal.close()  # a no-op in a forked child, where its thread does not exist

    def _call(self, call: Callable[[TankClient], Awaitable[T]]) -> T:
        """``await call(client)`` in the client's loop."""
        if not self.connected:
            self.connect()
        portal, client = self._portal, self._client
        if portal is None or client is None:
            raise ClientClosed("the Tank client is closed")
        try:
            return portal.call(call, client)
        except PortalClosed:
            raise ClientClosed("the Tank client is closed") from None

    # ----------------------------------------------------------------------- calls

    def produce(self, batches: Mapping[TopicPartition, Sequence[MessageLike]], *,
                codec: Codec | None = None, sparse: bool = False) -> None:
        """See :meth:`TankClient.produce`."""
        self._call(lambda c: c.produce(batches, codec=codec, sparse=sparse))

    def produce_bundles(self, bundles: Mapping[TopicPartition, bytes]) -> None:
        """See :meth:`TankClient.produce_bundles`."""
        self._call(lambda c: c.produce_bundles(bundles))

    def produce_with_seqnum(
            self, batches: Mapping[TopicPartition, tuple[int, Sequence[MessageLike]]], *,
            codec: Codec | None = None) -> None:
        """See :meth:`TankClient.produce_with_seqnum`."""
        self._call(lambda c: c.produce_with_seqnum(batches, codec=codec))

    def consume(self, topic: str, partition: int, seq: int, *, max_wait_ms: int = 0,
                min_bytes: int = 0, fetch_size: int = DEFAULT_FETCH_SIZE) -> ConsumeResult:
        """See :meth:`TankClient.consume`."""
        return self._call(lambda c: c.consume(topic, partition, seq, max_wait_ms=max_wait_ms,
                                              min_bytes=min_bytes, fetch_size=fetch_size))

    def consume_many(self, positions: Mapping[TopicPartition, int], *, max_wait_ms: int = 0,
                     min_bytes: int = 0, fetch_size: int = DEFAULT_FETCH_SIZE
                     ) -> dict[TopicPartition, ConsumeResult]:
        """See :meth:`TankClient.consume_many`."""
        return self._call(lambda c: c.consume_many(positions, max_wait_ms=max_wait_ms,
                                                   min_bytes=min_bytes,
                                                   fetch_size=fetch_size))

    def create_topic(self, topic: str, partitions: int,
                     config: str | Mapping[str, str] = "") -> None:
        self._call(lambda c: c.create_topic(topic, partitions, config))

    def discover_partitions(self, topic: str, partitions: Sequence[int] | None = None
                            ) -> list[PartitionBounds]:
        return self._call(lambda c: c.discover_partitions(topic, partitions))

    def discover_topics(self) -> list[TopicInfo]:
        return self._call(lambda c: c.discover_topics())

    def reload_conf(self, topic: str, partition: int) -> None:
        self._call(lambda c: c.reload_conf(topic, partition))

    def status(self) -> BrokerStatus:
        return self._call(lambda c: c.status())

    # ---------------------------------------------------------------------- closing

    def close(self) -> None:
        """Close the connection and stop the thread (idempotent)."""
        with self._lock:
            self._closed = True
            portal, client = self._portal, self._client
            if portal is not None and client is not None and portal.owned_by_this_process:
                with contextlib.suppress(PortalClosed):
                    portal.call(client.aclose)
            self._drop()

    def __enter__(self) -> BlockingTankClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _restore(host: str, port: int, options: TankOptions) -> BlockingTankClient:
    return BlockingTankClient(host, port, connect=False, **options)
