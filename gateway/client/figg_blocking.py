"""A blocking face of :class:`~gateway.client.figg.FiggClient`, for scripts.

::

    with BlockingFiggClient("127.0.0.1", 8119) as client:
        client.publish_and_wait("orders", b"hello")
        sub = client.subscribe("orders", from_offset=0)
        message = sub.get(timeout=5)        # FiggMessage(topic, offset, data)

A background thread runs trio and the async client
(:class:`~gateway.client._portal.TrioPortal`); each call crosses over and blocks until
answered. Received messages wait in a bounded ``queue.Queue`` per subscription; while it
is full the client stops reading, as the async client does.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar, TypeVarTuple, Unpack

import trio

from gateway.client._portal import PortalClosed, TrioPortal
from gateway.client.figg import (
    ClientClosed,
    ClientError,
    FiggClient,
    FiggMessage,
    FiggOptions,
    Subscription,
)

__all__ = ["BlockingFiggClient", "BlockingSubscription"]

T = TypeVar("T")
Args = TypeVarTuple("Args")

#: How often a pump re-checks a full queue.
_POLL_SECS = 0.005


class BlockingSubscription:
    """Messages of one topic: :meth:`get`, or iterate (blocks until the next message)."""

    def __init__(self, owner: BlockingFiggClient, topic: str, maxsize: int) -> None:
        self.topic = topic
        self._owner = owner
        self._queue: queue.Queue[FiggMessage | None] = queue.Queue(maxsize)
        self.subscription: Subscription | None = None
        self._last_offset: int | None = None
        self._failure: ClientError | None = None

    @property
    def last_offset(self) -> int | None:
        """Offset of the last message :meth:`get` returned (ATTACHED's before any)."""
        if self._last_offset is None and self.subscription is not None:
            return self.subscription.start_offset
        return self._last_offset

    @property
    def start_offset(self) -> int | None:
        """Where the server started the subscription (ATTACHED's offset)."""
        return None if self.subscription is None else self.subscription.start_offset

    def get(self, timeout: float | None = None) -> FiggMessage:
        """The next message; ``queue.Empty`` after ``timeout``, ``EOFError`` once ended
        (the client's failure, such as RequestRefused, when it gave up)."""
        message = self._queue.get(timeout=timeout)
        if message is None:
            self._queue.put(None)  # stay ended for later calls
            if self._failure is not None:
                raise self._failure
            raise EOFError(f"subscription to {self.topic!r} ended")
        self._last_offset = message.offset
        return message

    def __iter__(self) -> Iterator[FiggMessage]:
        while True:
            try:
                yield self.get()
            except EOFError:
                return

    def unsubscribe(self) -> None:
        """Detach and wait for DETACHED."""
        self._owner.unsubscribe(self.topic)

    async def _pump(self, sub: Subscription) -> None:
        put = self._queue.put_nowait
        try:
            async for message in sub:
                while True:
                    try:
                        put(message)
                        break
                    except queue.Full:
                        await trio.sleep(_POLL_SECS)
        except ClientError as exc:
            self._failure = exc  # the client gave up: get() raises it after the rest
        finally:
            while True:
                try:
                    put(None)
                    break
                except queue.Full:
                    # The reader is gone or slow: make room for the end marker.
                    with contextlib.suppress(queue.Empty):
                        self._queue.get_nowait()


class BlockingFiggClient:
    """The async Figg client behind blocking calls; close it (or use ``with``).

    Keyword ``options`` are :class:`FiggClient`'s (window, ping_interval, backoff, ...);
    ``on_state_change`` runs in the client's thread.
    """

    def __init__(self, host: str, port: int, **options: Unpack[FiggOptions]) -> None:
        self._client = FiggClient(host, port, **options)
        self._portal = TrioPortal("figg-client")
        try:
            self._portal.call(self._portal.nursery.start, self._client.run)
        except BaseException:
            self._portal.close()
            raise

    @property
    def client(self) -> FiggClient:
        """The async client (touch it only from the client's thread)."""
        return self._client

    def _call(self, fn: Callable[[*Args], Awaitable[T]], *args: *Args) -> T:
        if self._client.closed:
            raise self._client.failure or ClientClosed("the Figg client is closed")
        try:
            return self._portal.call(fn, *args)
        except PortalClosed:
            raise ClientClosed("the Figg client is closed") from None

    def wait_connected(self, timeout: float | None = None) -> None:
        """Block until connected; ``TimeoutError`` after ``timeout`` seconds."""
        async def wait() -> None:
            with trio.fail_after(timeout if timeout is not None else float("inf")):
                await self._client.wait_connected()
        try:
            self._call(wait)
        except trio.TooSlowError:
            raise TimeoutError("not connected in time") from None

    def publish(self, topic: str, data: bytes,
                on_ack: Callable[[int], object] | None = None) -> int:
        """Publish; blocks only while the window is full. ``on_ack`` runs in the client's
        thread. Returns the sequence number."""
        return self._call(self._client.publish, topic, data, on_ack)

    def publish_and_wait(self, topic: str, data: bytes) -> int:
        """Publish and block until acknowledged."""
        return self._call(self._client.publish_and_wait, topic, data)

    def wait_all_acked(self) -> None:
        """Block until every publish so far is acknowledged."""
        self._call(self._client.wait_all_acked)

    def subscribe(self, topic: str, *, from_offset: int | None = None,
                  maxsize: int = 10_000) -> BlockingSubscription:
        """Attach (blocks until ATTACHED); messages queue up to ``maxsize``."""
        blocking = BlockingSubscription(self, topic, maxsize)

        async def attach() -> None:
            sub = await self._client.subscribe(topic, from_offset=from_offset)
            blocking.subscription = sub
            self._portal.nursery.start_soon(blocking._pump, sub)

        self._call(attach)
        return blocking

    def unsubscribe(self, topic: str) -> None:
        """Detach from ``topic`` and wait for DETACHED."""
        self._call(self._client.unsubscribe, topic)

    def close(self) -> None:
        """Close the connection and stop the thread (idempotent)."""
        with contextlib.suppress(PortalClosed):
            self._portal.call(self._client.aclose)
        self._portal.close()

    def __enter__(self) -> BlockingFiggClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
