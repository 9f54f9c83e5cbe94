"""What both listeners need from a log, whichever log serves them.

The Tank and Figg listeners speak only to a :class:`Backend`. Two implementations
exist: the embedded store (``gateway.backend.embedded``) and, in bridge mode, an upstream
Tank broker. A listener never asks which one it has.

The calls are shaped after Tank's own requests, because Tank is the richer of the
two protocols and a Tank broker must be able to serve them one to one:

- :meth:`Backend.produce` appends bundles to partitions (a Figg flush and a Tank
  Produce both become one call);
- :meth:`Backend.fetch` reads from several partitions and long-polls when none has
  data: the waiting happens inside the backend, so an upstream broker can do it;
- the admin calls mirror Tank's admin requests;
- a missing topic is created per :class:`AutoCreate`, the one policy all backends apply
  (:func:`ensure_topic` for a reader that wants a topic's bounds);
- a backend in front of an upstream (bridge, upstream Kafka: :attr:`Backend.has_upstream`)
  raises :class:`BackendUnavailable` (a subclass of it) where a call can not be answered
  because the upstream is away, and says whether it is away now
  (:meth:`Backend.unavailable`).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from gateway.io.completion import completed
from protocols.tank.bundle import BundleInfo
from protocols.topics import TopicInfo as TopicInfo  # re-exported: part of the contract
from protocols.topics import is_valid_topic_name

if TYPE_CHECKING:
    from gateway.store.config import ConfigBounds, TopicConfig
    from gateway.store.producers import ProducerBatch


class ProduceCode(enum.IntEnum):
    """Per-partition outcome of an append, with Tank's Produce response codes."""

    OK = 0
    UNKNOWN_PARTITION = 1
    IO_FAULT = 2
    ACK_TIMEOUT = 3
    INVALID_SEQUENCE = 10
    READ_ONLY = 0xFE
    UNKNOWN_TOPIC = 0xFF


class FetchStatus(enum.Enum):
    """What a fetch found for one requested partition."""

    DATA = "data"                  # a chunk of whole bundles follows (possibly empty after a wait)
    BOUNDARY = "boundary"          # the sequence is outside [first_available, hwm + 1]
    UNKNOWN_TOPIC = "unknown_topic"
    UNKNOWN_PARTITION = "unknown_partition"
    FAULT = "fault"                # the partition could not be read (I/O error, upstream down)
    DENIED = "denied"              # an upstream cluster refused the gateway the read


class Chunk(Protocol):
    """A run of ``varint len | bundle`` bytes, in memory or in a segment file.

    A file-backed chunk keeps its file open until :meth:`close`, so it stays valid
    while its segment is rolled or deleted.
    """

    @property
    def length(self) -> int: ...

    def read_bytes(self) -> bytes:
        """The chunk's bytes, read into memory."""

    def sendfile_source(self) -> tuple[int, int] | None:
        """``(fd, offset)`` to hand to ``os.sendfile``, or None when held in memory."""

    def close(self) -> None:
        """Release the file behind the chunk (idempotent)."""


@dataclass(frozen=True, slots=True)
class BytesChunk:
    """A chunk held in memory (bridge mode, caches, tests)."""

    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)

    def read_bytes(self) -> bytes:
        return self.data

    def sendfile_source(self) -> None:
        return None

    def close(self) -> None:
        pass


EMPTY_CHUNK = BytesChunk(b"")


@dataclass(frozen=True, slots=True)
class ProduceBatch:
    """One bundle for one partition. ``base_seq`` is set for ProduceWithSeqnum.

    ``info`` is the bundle's header when the gateway built the bundle itself (Figg
    publishes): such a bundle is trusted, not validated again. A bundle from a client
    comes without it and is validated in full.
    """

    topic: str
    partition: int
    bundle: bytes
    base_seq: int | None = None
    info: BundleInfo | None = None
    #: An idempotent Kafka producer's stamp (checked by the Kafka listener): the embedded
    #: store keeps it durably with the batch (:mod:`gateway.store.producers`).
    producer: ProducerBatch | None = None


@dataclass(frozen=True, slots=True)
class ProduceOutcome:
    """The result of one :class:`ProduceBatch`.

    ``first_seq``/``last_seq`` are set when ``code`` is OK and the backend knows them (the
    embedded store always does; a Tank upstream's Produce response does not carry them,
    so the bridge leaves them 0 unless the batch named its own sequence numbers:
    :func:`gateway.backend.placed.produce_placed` names them for callers that need them).
    """

    code: ProduceCode
    first_seq: int = 0
    last_seq: int = 0
    reason: str = ""
    #: The Kafka error code a Kafka client gets instead of ``code``'s usual one (0: that
    #: one): an upstream Kafka cluster's own refusal, e.g. MESSAGE_TOO_LARGE.
    kafka_error: int = 0
    #: With IO_FAULT from the embedded store: the kind of store fault (:data:`STORE_FAULTS`),
    #: which the HTTP front ends answer by (507 for ``no_space``); "" otherwise.
    fault: str = ""


#: The kinds of store fault a produce or a topic creation can fail with: the disk is full
#: (or the free-space floor refused the write), mounted read-only, or failing (EIO, a failed
#: fsync). Every protocol answers them as a server fault: Tank's I/O fault, Kafka's
#: KAFKA_STORAGE_ERROR, HTTP 507 / 503 / 500.
STORE_FAULTS: Final = ("no_space", "read_only", "io_error")


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Read one partition from ``seq`` (0: first available; 2**64-1: the tail)."""

    topic: str
    partition: int
    seq: int
    fetch_size: int


@dataclass(slots=True)
class FetchOutcome:
    """What a fetch returned for one :class:`FetchRequest`.

    ``base_seq`` (DATA with bundles in the chunk): the sequence of the first message of
    the chunk's first bundle; None when that bundle is sparse (it carries its own
    sequences) or the chunk is empty. ``resolved_seq`` (DATA): the sequence the request
    resolved to, 0 and UINT64_MAX made concrete, where the read started; always set when
    the chunk is empty, None where the backend does not know it (an upstream broker
    answering with bundles). ``next_seq`` (DATA with bundles in the chunk): where the
    next read starts, after the chunk's last bundle, as the backend knows it from its
    read (the store's range, the upstream feed's bundles); None where it does not (a
    Tank broker's Consume answer: the chunk's bundle headers say it,
    :func:`~protocols.tank.bundle.chunk_end`). ``chunk`` must be closed by whoever
    consumes it.
    """

    status: FetchStatus
    high_water_mark: int = 0
    first_available: int = 0
    base_seq: int | None = None
    chunk: Chunk = EMPTY_CHUNK
    resolved_seq: int | None = None
    next_seq: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """Bounds of one partition, as Tank's DiscoverPartitions reports them.

    A partition that never held a message is ``(0, 0)``; one whose messages retention
    removed is ``(hwm + 1, hwm)``. Sequence numbers start at 1.
    """

    first_available: int
    high_water_mark: int


@dataclass(frozen=True, slots=True)
class BackendStatus:
    """What Tank's Status request reports."""

    topics: int
    partitions: int
    open_partitions: int
    open_time_ms: int
    startup_ts: int
    version: int


class CreateTopicCode(enum.IntEnum):
    """CreateTopic outcomes, with Tank's codes."""

    OK = 0
    EXISTS = 1
    SYSTEM_ERROR = 2
    BAD_CONFIG = 4
    READ_ONLY = 5
    INVALID = 10


class ReloadConfCode(enum.IntEnum):
    OK = 0
    IO_ERROR = 2
    PARSE_ERROR = 3
    UNKNOWN_PARTITION = 10
    UNKNOWN_TOPIC = 11


#: Called with the outcomes of a :meth:`Backend.produce_nowait`, in batch order.
ProduceDone = Callable[[list[ProduceOutcome]], None]
#: Called by a backend's tail read (:meth:`Backend.watch_tail`): True when data arrived,
#: False when the read failed or ended (the watcher then fetches to learn why).
TailChange = Callable[[bool], None]


class TopicRefused(Exception):
    """A topic that does not exist and was not created; the message says why.

    ``code`` is the failed creation's outcome, None when the policy did not allow one;
    ``fault`` the kind of store fault that failed it (:data:`STORE_FAULTS`: the topic is
    not unknown, the server can not write it now), "" otherwise.
    """

    def __init__(self, reason: str, code: CreateTopicCode | None = None,
                 fault: str = "") -> None:
        super().__init__(reason)
        self.code = code
        self.fault = fault


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a backend just refused to create a topic: a limit it reached, or a store fault
    (``fault``, one of :data:`STORE_FAULTS`)."""

    reason: str
    fault: str = ""


class BackendUnavailable(ConnectionError):
    """The backend's upstream (a Tank broker, a Kafka cluster) did not answer in time: the
    request may be tried again later. The upstream backends raise
    :class:`UpstreamUnavailable`.

    It is a ``ConnectionError`` (an ``OSError``) for the callers that treat it as a lost
    connection; a front end that serves clients catches it *before* it catches socket
    errors, since it is not the client's socket that failed."""


class UpstreamUnavailable(BackendUnavailable):
    """An upstream backend's broker or cluster (the bridge's Tank broker, the upstream Kafka
    cluster) could not be reached, or did not answer, before the request's deadline."""


def ensure_available(backend: Backend) -> None:
    """Raise :class:`BackendUnavailable` now when ``backend`` knows its upstream is away:
    a caller is told at once, not held for the backend's own wait for its upstream."""
    reason = backend.unavailable()
    if reason is not None:
        raise BackendUnavailable(reason)


#: ``create_topic(name, partitions)`` of a backend.
CreateTopic = Callable[[str, int], Awaitable[CreateTopicCode]]


@dataclass(frozen=True, slots=True)
class AutoCreate:
    """The one topic auto-creation policy, which every backend applies.

    A topic that does not exist is created on first use (a Figg ATTACH or PUBLISH, a Tank
    Produce: :func:`ensure_topic`, and each backend's produce) when ``enabled`` and its
    name is a valid topic name, with ``partitions`` partitions and the default config.
    One that somebody else created meanwhile (EXISTS) is as good. ``explain(topic)``,
    when a backend gives it, says why the creation just refused was refused (a limit it
    reached, a store fault), for the refusal's message and fault.
    """

    enabled: bool = True
    partitions: int = 1
    explain: Callable[[str], Refusal | None] | None = field(default=None, compare=False)

    def allows(self, topic: str) -> bool:
        """Whether a missing ``topic`` is to be created."""
        return self.enabled and is_valid_topic_name(topic)

    async def create(self, topic: str, create_topic: CreateTopic) -> None:
        """Create the missing ``topic`` with ``create_topic``; it exists on return.

        Raises :class:`TopicRefused` when the policy does not allow it or it failed.
        """
        if not self.allows(topic):
            raise TopicRefused(f"unknown topic {topic!r}")
        code = await create_topic(topic, self.partitions)
        if code not in (CreateTopicCode.OK, CreateTopicCode.EXISTS):
            why = self.explain(topic) if self.explain is not None else None
            if why is None:
                raise TopicRefused(f"could not create topic {topic!r}: {code.name.lower()}",
                                   code)
            raise TopicRefused(why.reason, code, why.fault)


@dataclass(frozen=True)
class TopicConfigs:
    """The topic settings a backend keeps itself (the embedded store's): what a new topic
    gets, the bounds a topic's own settings must keep, and each topic's settings."""

    defaults: TopicConfig
    bounds: ConfigBounds
    #: ``of(topic)``: that topic's settings, None when there is no such topic.
    of: Callable[[str], TopicConfig | None]


#: ``append(bundle, message_count) -> taken``: see :meth:`Backend.fast_appender`.
FastAppender = Callable[[bytes, int], bool]


class Backend(Protocol):
    """The log both listeners serve. Implementations: embedded store, upstream broker."""

    #: When a missing topic is created (by produce and by :func:`ensure_topic`).
    auto_create: AutoCreate
    #: Whether produce outcomes carry the offsets appended (False for a Tank upstream,
    #: whose Produce response does not: :mod:`gateway.backend.placed` finds them).
    reports_offsets: bool
    #: Whether it stands in front of an upstream that may go away (a Tank broker, a Kafka
    #: cluster), which :meth:`unavailable` then watches.
    has_upstream: bool

    def unavailable(self) -> str | None:
        """Why the backend can not serve now (its upstream is away), or None while it
        can; always None without an upstream."""

    async def produce(self, batches: Sequence[ProduceBatch]) -> list[ProduceOutcome]:
        """Append each batch; the outcomes come back in the same order.

        Each bundle is validated before anything of it is appended; a bad bundle
        fails only its own batch. An OK outcome means durable per the durability mode.
        Unknown topics are created first as :attr:`auto_create` says.
        """

    def produce_nowait(self, batches: Sequence[ProduceBatch], on_done: ProduceDone) -> None:
        """Start :meth:`produce` and return at once; ``on_done(outcomes)`` is called once,
        in the trio thread, when every batch has its outcome.

        What the listeners use: the embedded store writes the bundles before this
        returns (so calls made one after the other are appended in that order) and calls
        ``on_done`` the moment their fsync returns, or before returning when there is no
        fsync to wait for. ``on_done`` must not raise.
        """

    async def fetch(self, requests: Sequence[FetchRequest], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        """Read each partition; long-poll when none has data, per Tank's rules.

        Returns at once when any requested partition has data or an error. Otherwise
        waits until the bundles appended since the call total at least ``min_bytes``
        or ``max_wait_ms`` passes, then answers with whatever is there.
        """

    def fetch_nowait(self, requests: Sequence[FetchRequest]) -> list[FetchOutcome] | None:
        """What :meth:`fetch` would answer at once (some partition has data or an
        error), without waiting; None when it would have to wait or go elsewhere to know.
        """

    def watch_tail(self, topic: str, partition: int, seq: int,
                   on_change: TailChange) -> Callable[[], None] | None:
        """Push instead of long poll, for a reader at the tail: ``on_change`` is called
        in the trio thread, synchronously from the task that moved the partition's tail
        read at ``seq`` (an arrival: True; a failure or its end: False), until the
        returned function is called; the reader then takes what came with
        :meth:`fetch_nowait`. No task wakes per arrival. ``on_change`` must not raise.
        None when the backend has no such read of the partition at ``seq`` now: the
        reader long-polls with :meth:`fetch`."""

    async def create_topic(self, name: str, partitions: int, config: str = ""
                           ) -> CreateTopicCode: ...

    async def discover_partitions(self, topic: str) -> list[PartitionInfo] | None:
        """Bounds of every partition of ``topic``; None when the topic is unknown."""

    async def discover_topics(self) -> list[TopicInfo]: ...

    async def reload_conf(self, topic: str, partition: int) -> ReloadConfCode: ...

    async def status(self) -> BackendStatus: ...

    def topic_configs(self) -> TopicConfigs | None:
        """The topic settings this backend keeps, or None when an upstream keeps them."""

    def fast_appender(self, topic: str, partition: int) -> FastAppender | None:
        """An appender for the listeners' one-pass Produce path
        (:func:`protocols.tank.scan.produce_run`): ``append(bundle, message_count)``
        appends a validated plain bundle to that partition now, with the outcome and
        metrics :meth:`produce_nowait` would give, and answers True; False, having done
        nothing, when :meth:`produce_nowait` must take it. None where this backend has no
        such path (an upstream; durability that waits for an fsync)."""

    async def issue_producer_id(self) -> int | None:
        """A producer id for an idempotent Kafka client in front, issued by the backend's
        upstream cluster (so unique across every gateway of it), or None where the Kafka
        listener numbers its own. ``ConnectionError`` when the upstream gives none."""

    async def aclose(self) -> None:
        """Finish in-flight appends, make them durable, release files and connections."""


async def ensure_topic(backend: Backend, topic: str) -> list[PartitionInfo]:
    """Bounds of every partition of ``topic``, created first when it does not exist and
    ``backend.auto_create`` allows it; :class:`TopicRefused` when it is not there."""
    infos = await backend.discover_partitions(topic)
    if infos is None:
        await backend.auto_create.create(topic, backend.create_topic)
        infos = await backend.discover_partitions(topic)
        if infos is None:
            raise TopicRefused(f"unknown topic {topic!r}")
    return infos


async def produce_and_wait(backend: Backend, batches: Sequence[ProduceBatch]
                           ) -> list[ProduceOutcome]:
    """:meth:`Backend.produce` made of :meth:`Backend.produce_nowait`.

    Cancelling the wait does not cancel the appends (they may still be acknowledged to
    nobody: both protocols' clients resend what was not acknowledged).
    """
    return await completed(lambda report: backend.produce_nowait(batches, report))


class ProduceQueue:
    """:meth:`Backend.produce_nowait` for a backend whose appends are async by nature (an
    upstream broker, a test backend).

    Calls reach ``produce`` in call order, one at a time: the calls queued while one is
    under way go together in the next (group commit, and one connection's publishes
    keep their order, which independent tasks would not guarantee). A failure fails the
    batches of that round with I/O fault.
    """

    def __init__(self, produce: Callable[[Sequence[ProduceBatch]],
                                         Awaitable[list[ProduceOutcome]]],
                 spawn: Callable[..., object]) -> None:
        self._produce = produce
        self._spawn = spawn
        self._queue: list[tuple[Sequence[ProduceBatch], ProduceDone]] = []
        self._running = False

    def submit(self, batches: Sequence[ProduceBatch], on_done: ProduceDone) -> None:
        """Queue a call; ``on_done`` gets its outcomes."""
        self._queue.append((batches, on_done))
        if not self._running:
            self._running = True
            self._spawn(self._drain)

    async def _drain(self) -> None:
        try:
            while self._queue:
                calls, self._queue = self._queue, []
                merged = [batch for batches, _ in calls for batch in batches]
                try:
                    outcomes = await self._produce(merged)
                except Exception as exc:
                    outcomes = [ProduceOutcome(ProduceCode.IO_FAULT, reason=repr(exc))
                                ] * len(merged)
                start = 0
                for batches, on_done in calls:
                    on_done(outcomes[start:start + len(batches)])
                    start += len(batches)
        finally:
            self._running = False
