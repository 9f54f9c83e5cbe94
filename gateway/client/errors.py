"""Exceptions of the client libraries.

Every exception a client raises on purpose is a :class:`ClientError`. Connection-level
failures (:class:`ConnectError`, :class:`ConnectionLost`, :class:`RequestTimeout`,
:class:`ClientClosed`, :class:`BadResponse`) are shared; :class:`RequestRefused` is how a
Figg server says no; :class:`TankError` and its subclasses carry what a Tank broker
answered.

They pickle with their fields (Spark ships exceptions from executors to the driver).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = [
    "PRODUCE_CODES", "BadResponse", "BoundaryError", "ClientClosed", "ClientError",
    "ConnectError", "ConnectionLost", "PartitionFault", "ProduceFailed", "RequestFailed",
    "RequestRefused", "RequestTimeout", "TankError", "TopicExistsError",
    "UnknownPartitionError", "UnknownTopicError", "os_reason", "produce_code_text",
]


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


class RequestRefused(ClientError):
    """The server closed the connection on the same request, connection after connection.

    A Figg server has no error message: it closes the connection on a request it
    refuses (an invalid topic name, a partition the topic does not have). The client
    gives up once ``attempts`` connections in a row ended that way without an answer;
    ``operation`` (``publish``, ``subscribe`` or ``unsubscribe``) and ``topic`` name the
    first request left unanswered.
    """

    def __init__(self, operation: str, topic: str, server: str, attempts: int) -> None:
        super().__init__(f"{server} closed the connection {attempts} times in a row without "
                         f"answering {operation} {topic!r}: it refuses the request (is the "
                         f"topic name valid, does the partition exist?); the server's log "
                         f"says why")
        self.operation = operation
        self.topic = topic
        self.server = server
        self.attempts = attempts
        self._ctor = (operation, topic, server, attempts)


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


#: What each Produce code means, for people (codes from Tank's protocol).
PRODUCE_CODES: Mapping[int, str] = {
    1: "the topic has no such partition",
    2: "the broker could not store it (an I/O fault, an invalid bundle, or a bridge "
       "without its upstream broker)",
    3: "the broker timed out waiting for acknowledgements",
    4: "not enough replicas",
    10: "invalid sequence numbers",
    0xFC: "another broker leads this partition",
    0xFD: "the partition has no leader",
    0xFE: "the broker is read-only",
    0xFF: "no such topic",
}


def produce_code_text(code: int) -> str:
    """``code`` (a Produce response code) in words, with the number."""
    return f"{PRODUCE_CODES.get(code, 'error')} (code {code})"


class ProduceFailed(TankError):
    """Some partitions of a Produce were not appended.

    ``errors`` maps ``(topic, partition)`` to Tank's code (1 unknown partition, 2 I/O fault
    or invalid bundle, 10 invalid sequence numbers, 0xff unknown topic, ...); partitions
    not in it were appended.
    """

    def __init__(self, errors: Mapping[tuple[str, int], int]) -> None:
        shown = "; ".join(f"{t}/{p}: {produce_code_text(c)}"
                          for (t, p), c in list(errors.items())[:5])
        more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
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


def os_reason(exc: OSError) -> str:
    """Why a connection attempt failed, in words ("Connection refused").

    trio wraps the attempts' errors (each naming the address again) in a group under a
    generic message; the first attempt's ``strerror`` is what a person needs.
    """
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno)
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        group = cause.__cause__
        if isinstance(group, BaseExceptionGroup) and group.exceptions:
            cause = group.exceptions[0]
        else:
            cause = group
    return str(exc)
