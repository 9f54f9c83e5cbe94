"""Connecting to the endpoints under test, and naming and creating benchmark topics."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, Final, Unpack

import trio

from gateway.client.errors import (
    PartitionFault,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from gateway.client.figg import FiggClient, FiggOptions, open_figg_client
from gateway.client.tank import TankClient, TankOptions, open_tank_client
from gateway.core.config import parse_address

DEFAULT_TANK: Final = "127.0.0.1:11011"
DEFAULT_FIGG: Final = "127.0.0.1:8119"
DEFAULT_KAFKA: Final = "127.0.0.1:9092"
#: Figg client options for benchmarks: pings rarer than the default (they cost nothing
#: but are noise), a connect that gives up instead of retrying for ever.
FIGG_OPTIONS: Final[dict[str, Any]] = {"ping_interval": 5.0, "connect_timeout": 10.0}
CONNECT_TIMEOUT: Final = 15.0

#: TLS of every client the bench makes (``ca``, ``cert``, ``key`` file paths, as
#: ``figtank bench --tls`` gives them; None: plain TCP). Set by :func:`use_tls` in the
#: process that prepares and in each worker process.
_tls: dict[str, Any] | None = None


def use_tls(options: dict[str, Any] | None) -> None:
    """Make every client of this process connect over TLS with ``options`` (the
    ``params["tls"]`` of a run), or plain TCP for None."""
    global _tls
    _tls = options


def _tls_options() -> dict[str, Any]:
    return {} if _tls is None else {"tls": True, **_tls}


def unique_topic(prefix: str) -> str:
    """A fresh topic name, so a run never reads another run's messages."""
    return f"{prefix}-{secrets.token_hex(4)}"


def new_run_id() -> int:
    """A random u32 that stamps every message of one run."""
    return secrets.randbits(32)


@asynccontextmanager
async def tank_client(address: str, **options: Unpack[TankOptions]
                      ) -> AsyncIterator[TankClient]:
    """A connected Tank client for ``host:port``."""
    host, port = parse_address(address)
    async with open_tank_client(host, port, client_id="figtank-bench",
                                **{**_tls_options(), **options}) as client:
        yield client


@asynccontextmanager
async def figg_client(address: str, **options: Unpack[FiggOptions]
                      ) -> AsyncIterator[FiggClient]:
    """A Figg client for ``host:port``, connected (ConnectionError if it can not be)."""
    host, port = parse_address(address)
    async with open_figg_client(host, port, **{**FIGG_OPTIONS, **_tls_options(), **options}
                                ) as client:
        with trio.move_on_after(CONNECT_TIMEOUT) as scope:
            await client.wait_connected()
        if scope.cancelled_caught:
            raise ConnectionError(f"could not connect to the Figg endpoint {address}")
        yield client


async def ensure_topic(client: TankClient, topic: str) -> None:
    """Create ``topic`` with one partition unless it exists (a Tank broker does not create
    topics on first produce; figtank does, but answers CreateTopic the same way)."""
    with suppress(TopicExistsError):
        await client.create_topic(topic, 1)


async def bounds(client: TankClient, topic: str) -> tuple[int, int]:
    """``(first_available, high_water_mark)`` of partition 0; ``(1, 0)`` when empty or
    unknown.

    Asks for every partition of the topic rather than for partition 0 by id: a standalone
    Tank broker answers a DiscoverPartitions that lists partitions with "no leader" for
    each of them (it looks for the partition's cluster leader), and answers the unlisted
    form with the real bounds.
    """
    try:
        parts = await client.discover_partitions(topic)
    except UnknownTopicError:
        return 1, 0
    part = next((p for p in parts if p.partition == 0), None)
    if part is None:
        raise UnknownPartitionError(topic, 0)
    if part.error:
        raise PartitionFault(topic, 0, part.error)
    if part.high_water_mark == 0:
        return 1, 0
    return max(part.first_available, 1), part.high_water_mark
