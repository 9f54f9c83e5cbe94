"""Produce through the upstream: concurrent appends merged into one request, topics created.

Every :meth:`ProduceForwarder.send` made in the same scheduler round (the bridge backend's
produce queue, admin-ordered Tank produces) goes upstream in one Produce
request, entries in call order; a call made while a request is in flight starts the next
request at once (requests are pipelined, not queued behind each other). One caller's
entries stay in order, so one partition's bundles are appended in the order given.

Entries the upstream answers with unknown topic are created there (CreateTopic) when the
backend's :class:`~gateway.core.contract.AutoCreate` allows it, then sent once more.
While the upstream is away a request waits for it until its deadline; a request whose
connection broke before the answer is sent again on the next connection. That is
at-least-once, the contract of both protocols' clients, which resend what was not
acknowledged anyway. Past the deadline the entries fail with I/O fault.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Final, TypeAlias

import structlog
import trio

from gateway.backend.bridge.upstream import Upstream
from gateway.client.tank import TankClient
from gateway.core.contract import (
    AutoCreate,
    CreateTopic,
    ProduceCode,
    TopicRefused,
    UpstreamUnavailable,
)

log = structlog.get_logger("figtank.bridge")

#: ``(topic, partition, bundle, base_seq or None)``: what goes upstream.
Entry: TypeAlias = tuple[str, int, bytes, int | None]

#: Bundle bytes in one upstream request (a larger bundle goes alone); well under the
#: frame limits of figtank (64 MiB by default) and Tank (256 MiB).
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
_MAX_TOPICS: Final = 255
_MAX_PARTITIONS: Final = 255


class _Call:
    __slots__ = ("codes", "done", "entries")

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = entries
        self.codes: list[int] | None = None
        self.done = trio.Event()


class ProduceForwarder:
    """Sends produce entries upstream; see the module doc.

    A missing topic is created upstream with ``create_topic(name, partitions)`` when
    ``auto_create`` allows it. ``wait_secs`` is how long a request waits for an absent
    upstream.
    """

    def __init__(self, upstream: Upstream, nursery: trio.Nursery, *, auto_create: AutoCreate,
                 create_topic: CreateTopic, wait_secs: float) -> None:
        self._upstream = upstream
        self._nursery = nursery
        self._auto_create = auto_create
        self._create_topic = create_topic
        self.wait_secs = wait_secs
        self._queue: list[_Call] = []
        self._scheduled = False

    async def send(self, entries: Sequence[Entry]) -> list[int]:
        """Produce ``entries``; Tank's code for each, in order."""
        call = _Call(entries)
        self._queue.append(call)
        if not self._scheduled:
            self._scheduled = True
            self._nursery.start_soon(self._flush)
        await call.done.wait()
        assert call.codes is not None
        return call.codes

    async def _flush(self) -> None:
        # Started with start_soon, so every call of the round that scheduled it is queued.
        calls, self._queue = self._queue, []
        self._scheduled = False
        try:
            entries = [e for call in calls for e in call.entries]
            try:
                codes = await self._forward(entries)
            except Exception as exc:  # a bug here must fail these appends, not the gateway
                log.exception("upstream_produce_crashed", error=repr(exc))
                codes = [ProduceCode.IO_FAULT] * len(entries)
            start = 0
            for call in calls:
                call.codes = codes[start:start + len(call.entries)]
                start += len(call.entries)
        finally:
            for call in calls:
                if call.codes is None:  # cancelled: the backend is closing
                    call.codes = [ProduceCode.IO_FAULT] * len(call.entries)
                call.done.set()

    async def _forward(self, entries: list[Entry]) -> list[int]:
        deadline = trio.current_time() + self.wait_secs
        codes = await self._send(entries, deadline)
        unknown = [i for i, code in enumerate(codes) if code == ProduceCode.UNKNOWN_TOPIC
                   and self._auto_create.allows(entries[i][0])]
        if not unknown:
            return codes
        created = set()
        for topic in dict.fromkeys(entries[i][0] for i in unknown):
            try:
                await self._auto_create.create(topic, self._create_topic)
            except TopicRefused as exc:
                assert exc.code is not None  # allowed: the creation itself failed
                log.warning("upstream_create_topic_failed", topic=topic, code=exc.code.name)
            else:
                created.add(topic)
        retry = [i for i in unknown if entries[i][0] in created]
        if retry:
            again = await self._send([entries[i] for i in retry], deadline)
            for i, code in zip(retry, again, strict=True):
                codes[i] = code
        return codes

    async def _send(self, entries: list[Entry], deadline: float) -> list[int]:
        """Send in as few requests as the limits allow, one after another (so a partition
        split across two requests keeps its order)."""
        codes: list[int] = []
        for request in _requests(entries):
            def produce(client: TankClient, request: list[Entry] = request
                        ) -> Awaitable[list[int]]:
                return client.produce_raw(request)

            try:
                codes += await self._upstream.call("produce", deadline, produce)
            except UpstreamUnavailable as exc:
                log.warning("upstream_produce_failed", reason=str(exc),
                            bundles=len(entries) - len(codes))
                codes += [ProduceCode.IO_FAULT] * (len(entries) - len(codes))
                break
        return codes


def _requests(entries: list[Entry]) -> list[list[Entry]]:
    """Split entries, in order, into requests: one kind each (plain or with sequence
    numbers), at most 255 topics of 255 partitions and :data:`MAX_REQUEST_BYTES`."""
    requests: list[list[Entry]] = []
    current: list[Entry] = []
    per_topic: dict[str, int] = {}
    size = 0
    for entry in entries:
        topic, _, bundle, base_seq = entry
        fits = (current
                and (current[0][3] is None) == (base_seq is None)
                and per_topic.get(topic, 0) < _MAX_PARTITIONS
                and (topic in per_topic or len(per_topic) < _MAX_TOPICS)
                and size + len(bundle) <= MAX_REQUEST_BYTES)
        if not fits and current:
            requests.append(current)
            current, per_topic, size = [], {}, 0
        current.append(entry)
        per_topic[topic] = per_topic.get(topic, 0) + 1
        size += len(bundle)
    if current:
        requests.append(current)
    return requests
