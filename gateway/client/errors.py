"""Exceptions of the client libraries.

Every exception a client raises on purpose is a :class:`ClientError`. Connection-level
failures (:class:`ConnectError`, :class:`ConnectionLost`, :class:`RequestTimeout`,
:class:`ClientClosed`, :class:`BadResponse`) are shared; :class:`TankError` and its
subclasses carry what a Tank broker answered.

They pickle with their fields (Spark ships exceptions from executors to the driver).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ClientError(Exception):
    """Base of every client exception."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self._ctor: tuple[Any, ...] = (message,)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._ctor


class ConnectError(ClientError, ConnectionError):
    """The server could not be reached, or did not greet the client in time."""


class ConnectionLost(ClientError, ConnectionError):
    """The connection ended before the request was answered; ``reason`` says why."""


class ClientClosed(ClientError):
    """The client was closed; the call can not complete."""


class RequestTimeout(ClientError, TimeoutError):
    """The server did not answer in time."""


class BadResponse(ClientError):
    """The server sent bytes the protocol does not allow (the connection is dropped)."""


class TankError(ClientError):
    """A Tank broker answered a request with an error."""


class UnknownTopicError(TankError):
    """The broker has no such topic."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r}")
        self.topic = topic
        self._ctor = (topic,)


class UnknownPartitionError(TankError):
    """The topic has no such partition."""

    def __init__(self, topic: str, partition: int) -> None:
        super().__init__(f"unknown partition {topic}/{partition}")
        self.topic = topic
        self.partition = partition
        self._ctor = (topic, partition)


class BoundaryError(TankError):
    """A Consume asked for a sequence outside ``[first_available, high_water_mark + 1]``.

    Restart from ``first_available`` (data before it was removed by retention) or from
    ``high_water_mark + 1``.
    """

    def __init__(self, topic: str, partition: int, requested: int, first_available: int,
                 high_water_mark: int) -> None:
        super().__init__(f"{topic}/{partition}: sequence {requested} is outside "
                         f"[{first_available}, {high_water_mark + 1}]")
        self.topic = topic
        self.partition = partition
        self.requested = requested
        self.first_available = first_available
        self.high_water_mark = high_water_mark
        self._ctor = (topic, partition, requested, first_available, high_water_mark)


class PartitionFault(TankError):
    """The broker could not serve a partition (``code``: 0xfb fault, 0xfd no leader, ...)."""

    def __init__(self, topic: str, partition: int, code: int) -> None:
        super().__init__(f"{topic}/{partition}: the broker could not serve it "
                         f"(code 0x{code:02x})")
        self.topic = topic
        self.partition = partition
        self.code = code
        self._ctor = (topic, partition, code)


class ProduceFailed(TankError):
    """Some partitions of a Produce were not appended.

    ``errors`` maps ``(topic, partition)`` to Tank's code (1 unknown partition, 2 I/O fault
    or invalid bundle, 10 invalid sequence numbers, 0xff unknown topic, ...); partitions
    not in it were appended.
    """

    def __init__(self, errors: Mapping[tuple[str, int], int]) -> None:
        shown = ", ".join(f"{t}/{p}: {c}" for (t, p), c in list(errors.items())[:5])
        more = f" and {len(errors) - 5} more" if len(errors) > 5 else ""
        super().__init__(f"produce failed for {shown}{more}")
        self.errors = dict(errors)
        self._ctor = (self.errors,)


class TopicExistsError(TankError):
    """CreateTopic for a topic that already exists."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists")
        self.topic = topic
        self._ctor = (topic,)


class RequestFailed(TankError):
    """An admin request answered with error ``code`` (see the request's Tank codes)."""

    def __init__(self, request: str, code: int, detail: str = "") -> None:
        super().__init__(f"{request} failed with code {code}{': ' + detail if detail else ''}")
        self.request = request
        self.code = code
        self.detail = detail
        self._ctor = (request, code, detail)
