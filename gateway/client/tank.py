"""An async (trio) Tank client.

::

    async with open_tank_client("127.0.0.1", 11011) as client:
        await client.produce({("orders", 0): [b"hello", Message(b"v", key=b"k")]})
        result = await client.consume("orders", 0, 1, max_wait_ms=1000)
        for message in result.messages:          # Message(value, key, timestamp, seq)
            ...
        next_seq = result.next_seq

What it does for you:

- connects and waits for the broker's greeting Ping (``connect_timeout``);
- pipelines: any number of tasks may call it at once over one connection; answers are
  matched to requests by request id, in whatever order the broker sends them;
- encodes one bundle per partition with Tank's compression rule (Snappy above 512
  messages or 1024 bytes of keys and values) and stamps messages without a timestamp;
- decodes chunks, skips the messages of the first bundle that precede the requested
  sequence, retries with a larger fetch size when a chunk ends in a partial bundle (a
  TANK 1 broker cuts chunks at the fetch size), and raises :class:`BoundaryError` with
  the first available sequence when the requested one is gone.

For gateways and tools that pass bundles on, :meth:`TankClient.produce_raw` and
:meth:`TankClient.consume_raw` send encoded bundles and return the broker's per-partition
answers (codes, bounds, raw chunks) without decoding or raising.

There is no reconnect: when the connection ends every call raises
:class:`ConnectionLost`; open a new client. Exceptions are in :mod:`gateway.client.errors`.
"""

from __future__ import annotations

import enum
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final, TypeAlias, TypedDict, Unpack, overload

import structlog
import trio

from gateway.client.errors import (
    BadResponse,
    BoundaryError,
    ClientClosed,
    ConnectError,
    ConnectionLost,
    PartitionFault,
    ProduceFailed,
    RequestFailed,
    RequestTimeout,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    os_reason,
)
from gateway.client.lone import running
from gateway.client.tls import (
    PathLike,
    TLSHandshakeFailed,
    client_context,
    open_stream,
    tls_failure,
)
from gateway.io.errors import ExceptionMap, socket_errors
from gateway.io.limits import RECEIVE_SIZE
from gateway.io.writer import FrameWriter
from protocols.connection import BROKER_MAX_FRAME, CLOSED, NEED_DATA, Role
from protocols.errors import ProtocolError, TruncatedFrame
from protocols.record import Answer, Request
from protocols.tank.bundle import Codec, Message, decode_chunk, encode_bundle
from protocols.tank.connection import Reply, TankConnection
from protocols.tank.messages import (
    ClusterTopology,
    ConsumePartition,
    ConsumePartitionResult,
    ConsumeRequest,
    ConsumeResponse,
    ConsumeTopic,
    CreateTopicRequest,
    CreateTopicResponse,
    DiscoverPartitionsRequest,
    DiscoverPartitionsResponse,
    DiscoverTopicsRequest,
    DiscoverTopicsResponse,
    DiscoverTopologyRequest,
    DiscoverTopologyResponse,
    Ping,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
    ProduceWithSeqnumPartition,
    ProduceWithSeqnumRequest,
    ProduceWithSeqnumTopic,
    ReloadConfRequest,
    ReloadConfResponse,
    StatusRequest,
    StatusResponse,
)
from protocols.tank.types import ConsumeFlags, CreateTopicError, ReloadConfError
from protocols.topics import TopicInfo
from protocols.wire import UINT64_MAX

__all__ = [
    "CLIENT_VERSION", "DEFAULT_FETCH_SIZE", "FIRST_AVAILABLE", "MAX_FETCH_SIZE", "TAIL",
    "BrokerStatus", "Codec", "ConsumeResult", "Message", "MessageLike", "PartitionBounds",
    "TankClient", "TankOptions", "TopicInfo", "TopicPartition", "open_tank_client",
    "topic_infos",
]

log = structlog.get_logger("figtank.client.tank")

#: Consume from the first available message.
FIRST_AVAILABLE: Final = 0
#: Consume only what is appended from now on (the high-water mark + 1).
TAIL: Final = UINT64_MAX
#: Bytes asked per partition unless told otherwise.
DEFAULT_FETCH_SIZE: Final = 1024 * 1024
#: The largest fetch size a partial-bundle retry grows to.
MAX_FETCH_SIZE: Final = 256 * 1024 * 1024
#: ``client_version`` sent in Produce and Consume (what Tank's C++ client sends).
CLIENT_VERSION: Final = 2

#: A message to produce: a value, ``(key, value)``, or a :class:`Message`.
MessageLike: TypeAlias = bytes | tuple[bytes | None, bytes] | Message
TopicPartition: TypeAlias = tuple[str, int]


class TankOptions(TypedDict, total=False):
    """:class:`TankClient`'s keyword arguments, for what passes them on."""

    client_id: str
    connect_timeout: float
    request_timeout: float | None
    max_frame_size: int
    ssl_context: ssl.SSLContext | None
    tls: bool
    ca: PathLike | None
    cert: PathLike | None
    key: PathLike | None


@dataclass(slots=True)
class ConsumeResult:
    """What one Consume returned for one partition.

    ``messages`` hold ``seq`` (absolute sequence number), ``value``, ``key`` and
    ``timestamp`` (ms); ``next_seq`` is where the next Consume should start.
    """

    topic: str
    partition: int
    messages: list[Message]
    next_seq: int
    high_water_mark: int


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    """One partition of a DiscoverPartitions answer; ``error`` is 0 unless it can not be
    served (then the sequence numbers are 0)."""

    partition: int
    first_available: int
    high_water_mark: int
    error: int = 0


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    topics: int
    partitions: int
    open_partitions: int
    open_time_ms: int
    startup_ts: int
    version: int
    cluster_aware: bool = False


#: The connection's socket failures and a broker's bytes that are not Tank (a frame cut
#: short by the connection's end is a lost connection, not bad bytes).
_SEND_ERRORS: Final = socket_errors("send", ConnectionLost)
_RECEIVE_ERRORS: Final = socket_errors("receive", ConnectionLost)
_BAD_FRAMES: Final = ExceptionMap(
    (TruncatedFrame, lambda exc: ConnectionLost(f"the broker closed the connection: {exc}")),
    (ProtocolError, lambda exc: BadResponse(f"bad frame from the broker: {exc}")))


class _Waiter:
    __slots__ = ("error", "event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: object = None
        self.error: BaseException | None = None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _messages(items: Iterable[MessageLike], now: int) -> list[Message]:
    out = []
    for item in items:
        if isinstance(item, Message):
            out.append(item if item.timestamp else
                       Message(item.value, item.key, now, item.seq))
        elif isinstance(item, tuple):
            key, value = item
            out.append(Message(bytes(value), None if key is None else bytes(key), now))
        else:
            out.append(Message(bytes(item), None, now))
    return out


def _by_topic(keys: Iterable[TopicPartition]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in keys:
        grouped.setdefault(topic, []).append(partition)
    if len(grouped) > 255 or any(len(p) > 255 for p in grouped.values()):
        raise ValueError("a Tank request holds at most 255 topics of at most 255 partitions")
    return grouped


class TankClient:
    """A Tank client on one connection; run it with :func:`open_tank_client`.

    TLS: ``ssl_context``, or ``tls=True`` (the system's CAs) with ``ca``, ``cert``,
    ``key`` file paths (:func:`gateway.client.tls.client_context`).
    ``request_timeout`` (seconds, None: wait forever) bounds each request; a Consume gets
    its ``max_wait_ms`` on top. ``client_id`` is sent in Produce and Consume.
    """

    def __init__(self, host: str, port: int, *, client_id: str = "figtank",
                 connect_timeout: float = 10.0, request_timeout: float | None = None,
                 max_frame_size: int = BROKER_MAX_FRAME,
                 ssl_context: ssl.SSLContext | None = None, tls: bool = False,
                 ca: PathLike | None = None, cert: PathLike | None = None,
                 key: PathLike | None = None) -> None:
        self.host = host
        #: TLS (None: plain TCP): ``ssl_context``, or one made of ``ca``, ``cert`` and
        #: ``key`` when any is given or ``tls`` is set (:func:`~gateway.client.tls.client_context`).
        self.ssl_context = ssl_context or (
            client_context(ca=ca, cert=cert, key=key) if tls or ca or cert or key else None)
        self.port = port
        self.client_id = client_id
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.max_frame_size = max_frame_size
        self._conn = TankConnection(Role.CLIENT, max_frame_size=max_frame_size)
        self._stream: trio.abc.Stream | None = None
        self._out: FrameWriter | None = None
        self._waiters: dict[int, _Waiter] = {}
        self._next_id = 0
        self._failure: Exception | None = None
        self._scope: trio.CancelScope | None = None

    # --------------------------------------------------------------- connection

    @property
    def connected(self) -> bool:
        return self._stream is not None and self._failure is None

    @property
    def failure(self) -> Exception | None:
        """Why the connection ended (the exception calls raise), or None while it works."""
        return self._failure

    async def connect(self) -> None:
        """Open the connection and wait for the broker's Ping (``connect_timeout``).

        Raises :class:`ConnectError`. Then run :meth:`serve` in a task.
        """
        if self._stream is not None or self._failure is not None:
            raise ClientClosed("a TankClient connects once: make a new one")
        self._stream = await self._connect()
        # No direct writes: requests made at once go out as one write.
        self._out = FrameWriter(self._stream, direct=False)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve the connection (after :meth:`connect`) until it ends or :meth:`aclose`.

        Never raises for connection trouble: the calls waiting then raise instead.
        """
        stream, out = self._stream, self._out
        if stream is None or out is None:
            raise RuntimeError("connect() first")
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._failure is not None:
                scope.cancel()  # closed before serving began
            try:
                task_status.started()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer, out, nursery.cancel_scope)
                    await self._reader(stream)
                    nursery.cancel_scope.cancel()
            finally:
                self._fail(ConnectionLost("connection closed"))
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(stream)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """:meth:`connect`, then :meth:`serve` (``task_status.started()`` once connected):
        for ``await nursery.start(client.run)``."""
        await self.connect()
        await self.serve(task_status=task_status)

    async def _connect(self) -> trio.abc.Stream:
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await open_stream(self.host, self.port, self.ssl_context)
                try:
                    await self._await_greeting(stream)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except trio.TooSlowError:
            raise ConnectError(f"{self.host}:{self.port} did not greet as a Tank broker within "
                               f"{self.connect_timeout:g} s (is it a Tank port?)") from None
        except TLSHandshakeFailed as exc:
            raise TLSHandshakeFailed(f"could not connect to {self.host}:{self.port}: {exc}"
                                     ) from None
        except OSError as exc:
            raise ConnectError(f"could not connect to {self.host}:{self.port}: "
                               f"{os_reason(exc)}") from exc
        return stream

    async def _await_greeting(self, stream: trio.abc.Stream) -> None:
        """Read until the broker's Ping; bytes after it stay in the connection."""
        conn = self._conn
        while True:
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except trio.BrokenResourceError as exc:
                refused = tls_failure(exc)
                if refused is not None:  # TLS 1.3: the server refused our certificate
                    raise TLSHandshakeFailed(f"could not connect to {self.host}:{self.port}: "
                                             f"the server refused TLS: {refused}") from None
                raise ConnectError(f"{self.host}:{self.port}: {exc}") from exc
            conn.receive_data(data)
            try:
                event = conn.next_event()
            except ProtocolError as exc:
                raise ConnectError(f"{self.host}:{self.port}: not a Tank broker ({exc})"
                                   ) from None
            if event is CLOSED:
                raise ConnectError(f"{self.host}:{self.port}: closed before its greeting")
            if event is NEED_DATA:
                continue
            if type(event) is Ping:
                return
            raise ConnectError(f"{self.host}:{self.port}: sent {event!r} before its Ping")

    async def aclose(self) -> None:
        """Close the connection; calls waiting or made later raise :class:`ClientClosed`."""
        self._fail(ClientClosed("the Tank client is closed"))
        if self._scope is not None:
            self._scope.cancel()
        await trio.lowlevel.checkpoint()

    def _fail(self, error: Exception) -> None:
        if self._failure is None:
            self._failure = error
        for waiter in self._waiters.values():
            if waiter.error is None and waiter.response is None:
                waiter.error = self._failure
                waiter.event.set()
        self._waiters.clear()

    async def _writer(self, out: FrameWriter, scope: trio.CancelScope) -> None:
        try:
            with _SEND_ERRORS:
                await out.run()
        except ConnectionLost as exc:
            self._fail(exc)
            scope.cancel()

    async def _reader(self, stream: trio.abc.Stream) -> None:
        conn = self._conn
        waiters = self._waiters
        try:
            while True:
                with _BAD_FRAMES:
                    event = conn.next_event()
                if event is NEED_DATA:
                    with _RECEIVE_ERRORS:
                        data = await stream.receive_some(RECEIVE_SIZE)
                    conn.receive_data(data)
                elif event is CLOSED:
                    raise ConnectionLost(
                        f"{self.host}:{self.port} closed the connection without answering "
                        f"(its log says why; a figtank bridge does so while its upstream "
                        f"broker is unreachable)")
                elif type(event) is Reply:
                    waiter = waiters.pop(event.request.request_id, None)
                    if waiter is not None:  # else its caller gave up (cancelled, timed out)
                        waiter.response = event.response
                        waiter.event.set()
                # A Ping from the broker needs no answer.
        except (ConnectionLost, BadResponse) as exc:
            self._fail(exc)

    # ----------------------------------------------------------------- requests

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._stream is None:
            raise ClientClosed("the Tank client is not connected: use open_tank_client()")

    def _request_id(self) -> int:
        pending = self._conn.pending
        while True:
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            if self._next_id not in pending:
                return self._next_id

    # A request's answer is of the class its record names (a Request[Answer]).
    @overload
    async def request(self, build: Callable[[int], Request[Answer]], *,
                      extra_wait: float = 0.0) -> Answer: ...
    @overload
    async def request(self, build: Callable[[int], object], *,
                      extra_wait: float = 0.0) -> object: ...


    async def request(self, build: Callable[[int], object], *, extra_wait: float = 0.0
                      ) -> object:
        """Send the request ``build(request_id)`` returns and wait for its response record
        (of the class that answers the request's).

        The low-level door to every request; the methods below are built on it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_usable()
        request_id = self._request_id()
        frame = self._conn.send(build(request_id))
        waiter = _Waiter()
        self._waiters[request_id] = waiter
        assert self._out is not None  # connected: _check_usable() says so
        self._out.put_nowait(frame)
        timeout = (self.request_timeout + extra_wait if self.request_timeout is not None
                   else float("inf"))
        try:
            with trio.move_on_after(timeout) as scope:
                await waiter.event.wait()
        finally:
            self._waiters.pop(request_id, None)
        if scope.cancelled_caught:
            raise RequestTimeout(f"no answer to request {request_id} within {timeout:g} s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.response

    # ------------------------------------------------------------------ produce

    async def produce(self, batches: Mapping[TopicPartition, Sequence[MessageLike]], *,
                      codec: Codec | None = None, sparse: bool = False,
                      required_acks: int = 1, ack_timeout_ms: int = 0) -> None:
        """Append messages to many partitions in one Produce: one bundle per partition.

        ``codec=None`` follows Tank's compression rule. Messages without a timestamp (0) get
        the current time. ``sparse=True`` writes a sparse bundle numbered by each
        :class:`Message`'s ``seq``. Raises :class:`ProduceFailed` naming the partitions that
        were not appended (the others were).
        """
        now = _now_ms()
        bundles = {key: encode_bundle(_messages(items, now), codec=codec, sparse=sparse)
                   for key, items in batches.items()}
        await self.produce_bundles(bundles, required_acks=required_acks,
                                   ack_timeout_ms=ack_timeout_ms)

    async def produce_bundles(self, bundles: Mapping[TopicPartition, bytes], *,
                              required_acks: int = 1, ack_timeout_ms: int = 0) -> None:
        """Produce already encoded bundles (no length prefix), one per partition."""
        grouped = _by_topic(bundles)

        def build(request_id: int) -> ProduceRequest:
            return ProduceRequest(CLIENT_VERSION, request_id, self.client_id, required_acks,
                                  ack_timeout_ms, [
                                      ProduceTopic(topic, [ProducePartition(
                                          p, bundles[(topic, p)]) for p in partitions])
                                      for topic, partitions in grouped.items()])

        _raise_produce_errors(await self.request(build))

    async def produce_with_seqnum(
            self, batches: Mapping[TopicPartition, tuple[int, Sequence[MessageLike]]], *,
            codec: Codec | None = None, required_acks: int = 1,
            ack_timeout_ms: int = 0) -> None:
        """ProduceWithSeqnum (mirroring, tools): ``{(topic, partition): (first_seq,
        messages)}``; the messages get ``first_seq``, ``first_seq + 1``, ... The first
        sequence must be above the partition's high-water mark (else code 10)."""
        now = _now_ms()
        grouped = _by_topic(batches)
        bundles = {key: (first, encode_bundle(_messages(items, now), codec=codec))
                   for key, (first, items) in batches.items()}

        def build(request_id: int) -> ProduceWithSeqnumRequest:
            return ProduceWithSeqnumRequest(
                CLIENT_VERSION, request_id, self.client_id, required_acks, ack_timeout_ms, [
                    ProduceWithSeqnumTopic(topic, [ProduceWithSeqnumPartition(
                        p, *bundles[(topic, p)]) for p in partitions])
                    for topic, partitions in grouped.items()])

        _raise_produce_errors(await self.request(build))

    async def produce_raw(self, entries: Sequence[tuple[str, int, bytes, int | None]], *,
                          required_acks: int = 1, ack_timeout_ms: int = 0) -> list[int]:
        """Produce encoded bundles as given and return the broker's code for each entry.

        ``entries`` are ``(topic, partition, bundle, first_seq)``: all with ``first_seq``
        None (one Produce) or all with a sequence (one ProduceWithSeqnum); ValueError
        otherwise. The same partition may appear more than once (appended in order). The
        codes (0 ok, see :class:`~gateway.client.errors.ProduceFailed`) come back in entry
        order; nothing is raised for them. For gateways and mirroring tools.
        """
        if not entries:
            raise ValueError("produce needs at least one bundle")
        with_seqnum = entries[0][3] is not None
        if any((e[3] is not None) != with_seqnum for e in entries):
            raise ValueError("either every entry has a first sequence number or none has")
        order = _entries_by_topic(entries)

        def first_seq(i: int) -> int:
            first = entries[i][3]
            assert first is not None  # with_seqnum: every entry has one
            return first

        def build(request_id: int) -> ProduceRequest | ProduceWithSeqnumRequest:
            if with_seqnum:
                return ProduceWithSeqnumRequest(
                    CLIENT_VERSION, request_id, self.client_id, required_acks, ack_timeout_ms,
                    [ProduceWithSeqnumTopic(topic, [ProduceWithSeqnumPartition(
                        entries[i][1], first_seq(i), entries[i][2]) for i in indexes])
                     for topic, indexes in order.items()])
            return ProduceRequest(
                CLIENT_VERSION, request_id, self.client_id, required_acks, ack_timeout_ms,
                [ProduceTopic(topic, [ProducePartition(entries[i][1], entries[i][2])
                                      for i in indexes])
                 for topic, indexes in order.items()])

        response: ProduceResponse = await self.request(build)
        codes = [0] * len(entries)
        for topic, indexes in zip(response.topics, order.values(), strict=True):
            for part, i in zip(topic.partitions, indexes, strict=True):
                codes[i] = part.error
        return codes

    # ------------------------------------------------------------------ consume
    async def consume_raw(self, entries: Sequence[tuple[str, int, int, int]], *,
                          max_wait_ms: int = 0, min_bytes: int = 0
                          ) -> list[ConsumePartitionResult | None]:
        """One Consume for ``(topic, partition, seq, fetch_size)`` entries, answered as the
        broker sent it, without decoding a message.

        Returns, in entry order, each partition's
        :class:`~protocols.tank.messages.ConsumePartitionResult` (``flags``, ``base_seq_num``,
        ``high_water_mark``, ``first_available_seq_num``, raw ``chunk`` bytes), or None where
        the broker does not know the topic. No partial-bundle retry: for gateways and tools
        that pass chunks on. Raises :class:`BadResponse` when the answer does not match.
        """
        if not entries:
            raise ValueError("consume needs at least one partition")
        order = _entries_by_topic(entries)

        def build(request_id: int) -> ConsumeRequest:
            return ConsumeRequest(CLIENT_VERSION, request_id, self.client_id, max_wait_ms,
                                  min_bytes, 0, [
                                      ConsumeTopic(topic, [ConsumePartition(
                                          entries[i][1], entries[i][2], entries[i][3])
                                          for i in indexes])
                                      for topic, indexes in order.items()])

        response: ConsumeResponse = await self.request(build, extra_wait=max_wait_ms / 1000)
        results: list[ConsumePartitionResult | None] = [None] * len(entries)
        if [t.name for t in response.topics] != list(order):
            raise BadResponse("the Consume response does not list the requested topics")
        for topic, indexes in zip(response.topics, order.values(), strict=True):
            if topic.unknown:
                continue
            if [p.partition for p in topic.partitions] != [entries[i][1] for i in indexes]:
                raise BadResponse(f"{topic.name}: the Consume response does not list the "
                                  "requested partitions")
            for part, i in zip(topic.partitions, indexes, strict=True):
                results[i] = part
        return results


    async def consume(self, topic: str, partition: int, seq: int, *, max_wait_ms: int = 0,
                      min_bytes: int = 0, fetch_size: int = DEFAULT_FETCH_SIZE
                      ) -> ConsumeResult:
        """Messages of one partition from sequence ``seq`` (:data:`FIRST_AVAILABLE`,
        :data:`TAIL` or a sequence number).

        With ``max_wait_ms`` the broker waits for appends when there is nothing to read,
        until they total ``min_bytes``. Raises :class:`BoundaryError` (with
        ``first_available``), :class:`UnknownTopicError`, :class:`UnknownPartitionError`
        or :class:`PartitionFault`.
        """
        results = await self.consume_many({(topic, partition): seq}, max_wait_ms=max_wait_ms,
                                          min_bytes=min_bytes, fetch_size=fetch_size)
        return results[(topic, partition)]

    async def consume_many(self, positions: Mapping[TopicPartition, int], *,
                           max_wait_ms: int = 0, min_bytes: int = 0,
                           fetch_size: int = DEFAULT_FETCH_SIZE
                           ) -> dict[TopicPartition, ConsumeResult]:
        """:meth:`consume` for many partitions in one request; raises for the first
        partition that got an error (nothing is consumed server-side: just retry)."""
        if not positions:
            raise ValueError("consume needs at least one partition")
        sizes = dict.fromkeys(positions, max(fetch_size, 1))
        results: dict[TopicPartition, ConsumeResult] = {}
        pending = dict(positions)
        while pending:
            parts = await self.consume_raw(
                [(*key, seq, sizes[key]) for key, seq in pending.items()],
                max_wait_ms=max_wait_ms, min_bytes=min_bytes)
            retry: dict[TopicPartition, int] = {}
            for (key, seq), part in zip(pending.items(), parts, strict=True):
                if part is None:
                    raise UnknownTopicError(key[0])
                result, partial = _decode_partition(key, seq, part)
                if partial:
                    sizes[key] = _grown(key, sizes[key], partial)
                    retry[key] = seq
                else:
                    results[key] = result
            pending = retry
            max_wait_ms = min_bytes = 0  # a retry only completes what was found
        return {key: results[key] for key in positions}

    # -------------------------------------------------------------------- admin

    async def create_topic(self, topic: str, partitions: int,
                           config: str | Mapping[str, str] = "") -> None:
        """Create ``topic`` with ``partitions`` partitions and Tank config keys.

        Raises :class:`TopicExistsError`, or :class:`RequestFailed` with Tank's code
        (2 system error, 4 bad config, 5 read-only, 10 invalid name or partition count).
        """
        if isinstance(config, Mapping):
            config = "".join(f"{k}={v}\n" for k, v in config.items())
        raw = config.encode()
        response: CreateTopicResponse = await self.request(
            lambda rid: CreateTopicRequest(rid, topic, partitions, raw))
        if response.error == CreateTopicError.EXISTS:
            raise TopicExistsError(topic)
        if response.error:
            raise RequestFailed("create_topic", response.error, _code_name(
                CreateTopicError, response.error))

    async def discover_partitions(self, topic: str, partitions: Sequence[int] | None = None
                                  ) -> list[PartitionBounds]:
        """Bounds of every partition of ``topic`` (or of the listed ones, in that order).

        Raises :class:`UnknownTopicError`.
        """
        wanted = list(partitions or ())
        response: DiscoverPartitionsResponse = await self.request(
            lambda rid: DiscoverPartitionsRequest(rid, topic, wanted))
        if not response.partitions:
            raise UnknownTopicError(topic)
        indexes = wanted or range(len(response.partitions))
        return [PartitionBounds(i, p.first_available_seq_num, p.high_water_mark, p.error)
                for i, p in zip(indexes, response.partitions, strict=False)]

    async def discover_topics(self) -> list[TopicInfo]:
        response: DiscoverTopicsResponse = await self.request(
            lambda rid: DiscoverTopicsRequest(rid, 0))
        return topic_infos(response)

    async def discover_topology(self) -> ClusterTopology | None:
        """The cluster topology, or None from a standalone broker."""
        response: DiscoverTopologyResponse = await self.request(
            lambda rid: DiscoverTopologyRequest(rid, 0))
        return response.cluster

    async def reload_conf(self, topic: str, partition: int) -> None:
        """Have the broker re-read the partition's ``config`` file."""
        response: ReloadConfResponse = await self.request(
            lambda rid: ReloadConfRequest(rid, topic, partition))
        if response.error == ReloadConfError.UNKNOWN_TOPIC:
            raise UnknownTopicError(topic)
        if response.error == ReloadConfError.UNKNOWN_PARTITION:
            raise UnknownPartitionError(topic, partition)
        if response.error:
            raise RequestFailed("reload_conf", response.error, _code_name(
                ReloadConfError, response.error))

    async def status(self) -> BrokerStatus:
        r: StatusResponse = await self.request(lambda rid: StatusRequest(rid))
        return BrokerStatus(r.topic_count, r.partition_count, r.open_partitions,
                            r.open_time_ms, r.startup_ts, r.version, bool(r.cluster_aware))


def _entries_by_topic(entries: Sequence[tuple[str, int, bytes, int | None]]
                     | Sequence[tuple[str, int, int, int]]) -> dict[str, list[int]]:
    """Entry indexes by topic, topics in order of first appearance (a request's layout)."""
    order: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        order.setdefault(entry[0], []).append(i)
    if len(order) > 255 or any(len(i) > 255 for i in order.values()):
        raise ValueError("a Tank request holds at most 255 topics of at most 255 partitions")
    return order


def _code_name(codes: type[enum.IntEnum], code: int) -> str:
    try:
        return codes(code).name.lower()
    except ValueError:
        return ""


def _raise_produce_errors(response: ProduceResponse) -> None:
    errors = {(t.name, p.partition): p.error for t in response.topics
              for p in t.partitions if p.error}
    if errors:
        raise ProduceFailed(errors)


def _grown(key: TopicPartition, size: int, partial: int) -> int:
    grown = max(partial, size * 2)
    if grown > MAX_FETCH_SIZE:
        raise BadResponse(f"{key[0]}/{key[1]}: a bundle of {partial} bytes is over the "
                          f"{MAX_FETCH_SIZE} byte fetch limit")
    return grown


def _decode_partition(key: TopicPartition, seq: int, part: ConsumePartitionResult
                      ) -> tuple[ConsumeResult, int]:
    """The partition's result, and the length to retry with when it ended in a partial
    bundle before any message was found (else 0)."""
    topic, partition = key
    flags = part.flags
    if flags == ConsumeFlags.BOUNDARY_CHECK:
        raise BoundaryError(topic, partition, seq, part.first_available_seq_num,
                            part.high_water_mark)
    if flags == ConsumeFlags.UNKNOWN_PARTITION:
        raise UnknownPartitionError(topic, partition)
    if flags not in (ConsumeFlags.OK, ConsumeFlags.SPARSE_FIRST_BUNDLE):
        raise PartitionFault(topic, partition, flags)
    hwm = part.high_water_mark
    chunk = part.chunk or b""
    if not chunk:
        # Nothing yet; a TANK broker puts first-available in base_seq here, so a
        # position that names no sequence resolves to the tail.
        next_seq = hwm + 1 if seq in (FIRST_AVAILABLE, TAIL) else seq
        return ConsumeResult(topic, partition, [], next_seq, hwm), 0
    base = None if flags == ConsumeFlags.SPARSE_FIRST_BUNDLE else part.base_seq_num
    min_seq = 0 if seq == TAIL else seq
    try:
        decoded = decode_chunk(chunk, base, min_seq)
    except ProtocolError as exc:
        raise BadResponse(f"{topic}/{partition}: corrupt chunk: {exc}") from None
    if decoded.partial_bundle_len and not decoded.messages:
        # Cut inside a bundle before any wanted message: ask for at least all of it.
        return (ConsumeResult(topic, partition, [], seq, hwm),
                decoded.consumed + decoded.partial_bundle_len)
    return ConsumeResult(topic, partition, decoded.messages, decoded.next_seq, hwm), 0


@asynccontextmanager
async def open_tank_client(host: str, port: int,
                           **options: Unpack[TankOptions]) -> AsyncIterator[TankClient]:
    """Connect a :class:`TankClient` (waiting for the broker's Ping) for the block.

    ``options`` are :class:`TankClient`'s keyword arguments. Raises
    :class:`~gateway.client.errors.ConnectError` when the broker can not be reached.
    """
    client = TankClient(host, port, **options)
    await client.connect()
    async with running(client.serve, client.aclose):
        yield client


def topic_infos(response: DiscoverTopicsResponse) -> list[TopicInfo]:
    """The topics a DiscoverTopics response names."""
    return [TopicInfo(t.name, t.partition_count, bool(t.enabled)) for t in response.topics]
