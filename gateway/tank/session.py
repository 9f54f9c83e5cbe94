"""One Tank connection on the server: read big, parse every frame, serve requests concurrently.

The reader task receives up to 256 KiB and dispatches every complete
request in the buffer:

- a Consume that finds data (or an error) is answered at once; one that must wait, and
  Status, DiscoverPartitions and DiscoverTopics, each run in their own task, so a
  long-polling Consume holds up nothing else; responses go out as they are ready, matched
  by request id on the client;
- a run of Produces of one bundle each to partitions the connection produced to before
  is appended and answered in one compiled pass where the backend offers an appender
  (:meth:`~gateway.core.contract.Backend.fast_appender`: the embedded store in ``os``
  durability), when nothing the connection has in flight or queued must go first;
- Produce and ProduceWithSeqnum are handed to the backend at once
  (:meth:`~gateway.core.contract.Backend.produce_nowait`: written before the next request is
  read, answered when durable); CreateTopic and ReloadConf go through the connection's
  :class:`~gateway.tank.lane.OrderedLane`, and Produces that arrive while one is pending
  queue behind it, so every request that changes the log is served in arrival order;
- DiscoverTopology is answered at once; a client's Ping gets no answer (as in Tank);
- RegReplica and ConsumePeer (broker-to-broker) and a Consume without topics close the
  connection, as the Tank broker does, with the reason logged.

Every response goes through the connection's one :class:`~gateway.tank.outbox.TankOutbox`.
Bad input (a malformed or oversized frame, an unknown msgId), a frame not complete
``limits.frame_timeout_secs`` after it began and a connection that sends nothing for
``limits.idle_timeout_secs`` while nothing is in flight close this connection only.

A connection's requests are admitted one by one, also within one read: the next waits
while the responses queued for it reach ``limits.response_buffer_bytes``, its requests
being served reach ``limits.max_requests_in_flight`` or its Produce bytes not yet answered
reach ``limits.unacked_bytes``; nothing more is read meanwhile. Each time a connection is
held back (once per episode, until a request is admitted without waiting) counts as a hit
of that limit and logs ``connection_held_back`` at debug level.

Under a quota of its principal (:mod:`gateway.auth.quotas`) the connection's reads wait
for the bytes-in and requests tokens (:class:`~gateway.serving.session.Session`), and a
Consume waits, before it is served, until the chunk bytes sent on earlier Consumes are
paid for (bytes out); nothing is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import ClassVar, Final, TypeAlias, TypeVar, TypeVarTuple, cast

import structlog
import trio

from gateway.auth.guard import OPEN, AccessGuard
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota
from gateway.core.contract import (
    Backend,
    FastAppender,
    FetchOutcome,
    FetchRequest,
    FetchStatus,
    ProduceBatch,
    ProduceOutcome,
)
from gateway.core.metrics import Metrics, RequestCounter
from gateway.core.sections import ConnectionLimits
from gateway.io.errors import STREAM_ERRORS, ExceptionMap, failed
from gateway.serving.lookup import look_up, topics_to_look_up
from gateway.serving.requests import RequestSession
from gateway.serving.session import PROTOCOL_ERRORS, CloseConnection
from gateway.tank import access, admin
from gateway.tank.consume import consume_reply, fetch_requests
from gateway.tank.lane import OrderedLane
from gateway.tank.outbox import ShortChunk, TankOutbox
from gateway.tank.produce import (
    AnyProduce,
    all_ok,
    produce_batches,
    produce_response,
    produce_response_frame,
)
from gateway.tank.settings import TankSettings
from protocols.connection import CLOSED, Role
from protocols.tank.connection import TankConnection
from protocols.tank.messages import (
    ConsumePeerRequest,
    ConsumeRequest,
    CreateTopicRequest,
    DiscoverPartitionsRequest,
    DiscoverTopicsRequest,
    DiscoverTopicsResponse,
    DiscoverTopologyRequest,
    Ping,
    ProduceRequest,
    ProduceWithSeqnumRequest,
    RegReplicaRequest,
    ReloadConfRequest,
    StatusRequest,
)
from protocols.tank.scan import ProducePass
from protocols.wire import UINT64_MAX

R = TypeVar("R")
Args = TypeVarTuple("Args")

#: Most produce bytes handed to the backend in one call.
LANE_BATCH_BYTES: Final = 8 * 1024 * 1024
#: Most partitions a connection keeps an appender for (its one-pass Produce path).
FAST_PARTITIONS: Final = 64

_PRODUCES: Final = (ProduceRequest, ProduceWithSeqnumRequest)
_NAMES: Final = {
    ProduceRequest: "produce", ProduceWithSeqnumRequest: "produce_with_seqnum",
    ConsumeRequest: "consume", Ping: "ping", DiscoverPartitionsRequest: "discover_partitions",
    CreateTopicRequest: "create_topic", ReloadConfRequest: "reload_conf",
    StatusRequest: "status", DiscoverTopicsRequest: "discover_topics",
    DiscoverTopologyRequest: "discover_topology", RegReplicaRequest: "reg_replica",
    ConsumePeerRequest: "consume_peer",
}
#: The admin requests answered in a task of their own (the others go through the lane).
_QUERIES: Final = (DiscoverPartitionsRequest, StatusRequest, DiscoverTopicsRequest)
#: What waits in the ordered lane: Produces, and the admin requests that change topics.
LaneRequest: TypeAlias = AnyProduce | CreateTopicRequest | ReloadConfRequest
_REFUSED: Final = {
    RegReplicaRequest: "RegReplica is obsolete (the Tank broker closes the connection too)",
    ConsumePeerRequest: "ConsumePeer is replication between clustered brokers; figtank is "
                        "standalone",
}


def _produce_size(request: AnyProduce) -> int:
    return sum(len(p.bundle) for t in request.topics for p in t.partitions)


class TankSession(RequestSession[TankConnection]):
    """Serves one accepted Tank connection until it closes; see :meth:`Session.run`."""

    #: The writer's failures: a broken socket, or a segment file that fails it.
    WRITE_ERRORS = ExceptionMap(
        (ShortChunk, lambda exc: CloseConnection("short_chunk", str(exc))),
        (STREAM_ERRORS, failed("send", partial(CloseConnection, "send_failed"))),
        (OSError, lambda exc: CloseConnection("backend_error", f"reading a chunk: {exc!r}")),
    )

    IDLE_REASON = "no request for {:g} s with nothing in flight"

    __slots__ = ("_access", "_appenders", "_auto_create", "_backend", "_counter", "_lane",
                 "_lane_served", "_polls", "_produce_bytes", "_read_partitions", "_stopping",
                 "principal")

    #: Serve runs of plain single-partition Produces in one pass (tests turn it off to
    #: compare it with the general path, its reference).
    fast_produce: ClassVar[bool] = True

    _outbox: TankOutbox

    def __init__(self, stream: trio.abc.Stream, *, backend: Backend, settings: TankSettings,
                 limits: ConnectionLimits, metrics: Metrics, counter: RequestCounter,
                 log: structlog.typing.FilteringBoundLogger,
                 principal: Principal | None = None,
                 guard: AccessGuard | None = None,
                 quota: PrincipalQuota | None = None) -> None:
        super().__init__(stream, TankOutbox(stream, settings.response_buffer_bytes),
                         limits=limits, metrics=metrics, log=log, quota=quota)
        #: Who the connection acts as (its listener, or its certificate's subject).
        self.principal = principal or Principal("tank")
        #: What the access policy lets it do.
        self._access = (guard or OPEN).connection(self.principal, log)
        self._auto_create = backend.auto_create.enabled
        self._backend = backend
        self._counter = counter
        #: Partitions this connection consumed, for the reader-lag gauge.
        self._read_partitions: set[tuple[str, int]] | None = None  # made with the first
        self._conn = TankConnection(Role.SERVER, max_frame_size=limits.max_frame_bytes)
        self._lane: OrderedLane[LaneRequest] = OrderedLane(LANE_BATCH_BYTES)
        #: A task serves the lane (started with the lane's first request, ends with its last).
        self._lane_served = False
        #: Bytes of Produce requests handed to the backend and not yet answered.
        self._produce_bytes = 0
        #: Each long poll's scope: cancelled by shutdown().
        self._polls: set[trio.CancelScope] | None = None  # made with the first
        self._stopping = False
        #: The backend's appenders of the partitions this connection produced to, for the
        #: one-pass path (:meth:`_serve_produces`); made with the first.
        self._appenders: dict[tuple[str, int], FastAppender] | None = None

    def _start_tasks(self, nursery: trio.Nursery) -> None:
        self._outbox.put_nowait(self._conn.send(Ping()))

    def _ended(self) -> None:
        for where in self._read_partitions or ():
            self._metrics.reader_lag.remove((self, where))

    def shutdown(self) -> None:
        """The server is stopping: read no more requests and drop the parked long polls
        (unanswered: the connection closes); the requests in flight are answered, then
        the connection closes. An idle connection closes at once."""
        self._stopping = True
        super().shutdown()
        for poll in self._polls or ():
            poll.cancel()

    # ------------------------------------------------------------------------- reading

    async def _received(self, data: bytes | bytearray) -> bool:
        """Dispatch every request in the buffer (read in one pass); True after a clean EOF.

        With appenders learnt (:meth:`_learn_appender`), the run of Produces the read
        carries on with goes the one-pass path (:meth:`_serve_produces`), the rest the
        general path; a frame begun in an earlier read that the run does not take is
        ended by the general path, and the run goes on after it."""
        start = 0
        if self._appenders is not None and type(data) is bytes and data:
            start = self._serve_produces(data, 0)
            if not start and self._conn.buffered:
                begun = self._conn.rest_of_frame(data)
                if begun < len(data):
                    await self._requests_in(data[:begun])
                    start = self._serve_produces(data, begun)
            if start == len(data):
                return False
        return await self._requests_in(data, start)

    async def _requests_in(self, data: bytes | bytearray, start: int = 0) -> bool:
        """Dispatch every request in ``data[start:]`` (the general path); True after a
        clean EOF."""
        with PROTOCOL_ERRORS:
            events, error = self._conn.receive_requests(data, ProduceBatch, start)
        for event in events:
            if event is CLOSED:
                return True
            if self._must_wait():
                await self._admit()
            if type(event) is ProducePass:
                self._produce_pass(event)
                continue
            quota = self._quota
            if quota is not None and quota.out_limited and type(event) is ConsumeRequest:
                await self._throttle(quota.wait_out)
            self._dispatch(event)
        if error is not None:
            try:
                with PROTOCOL_ERRORS:
                    raise error
            finally:
                del error  # the traceback holds this frame: no cycle through its locals
        return False

    def _serve_produces(self, data: bytes, start: int) -> int:
        """The one-pass path: append and answer the Produces at ``data[start:]``, when
        nothing this connection has in flight or queued must go first; returns where in
        ``data`` it stopped."""
        appenders = self._appenders
        assert appenders is not None
        if (self._lane.busy or self._produce_bytes or not self._access.open
                or self._close is not None or self._must_wait()):
            return start
        # The Tank outbox's limit is limits.response_buffer_bytes: its room is whole.
        taken, responses, count = self._conn.serve_produces(data, start, appenders,
                                                            int(self._outbox.room))
        if count:
            self.requests += count
            self._last_activity = self._last_read
            self._outbox.put_nowait(responses)
            self._counter.inc("produce", True, count)
        return taken

    def _learn_appender(self, topic: str, partition: int) -> None:
        """After a Produce to one partition went well through the general path: keep the
        backend's appender for that partition, if it has one."""
        appenders = self._appenders
        key = (topic, partition)
        if appenders is not None and (key in appenders or len(appenders) >= FAST_PARTITIONS):
            return
        appender = self._backend.fast_appender(topic, partition)
        if appender is not None:
            if appenders is None:
                appenders = self._appenders = {}
            appenders[key] = appender

    def _unacked_bytes(self) -> int:
        return self._lane.queued_bytes + self._produce_bytes

    def _dispatch(self, request: object) -> None:
        kind = type(request)
        self._received_request()
        if isinstance(request, ConsumeRequest):
            if not request.topics:
                raise CloseConnection("refused", "Consume without topics (the Tank broker "
                                      "closes the connection too)")
            asked = fetch_requests(request)
            hidden = None if self._access.open else access.hidden_topics(self._access, request)
            wanted = access.visible(asked, hidden)
            outcomes = self._backend.fetch_nowait(wanted) if wanted else []
            if outcomes is None:  # every partition at its tail: long-poll in a task
                self._start(self._consume, request, asked, hidden)
            else:
                self._reply_consume(request, asked, access.with_hidden(asked, hidden, outcomes))
        elif isinstance(request, _PRODUCES):
            self._begin()
            self._produce_request(request, _produce_size(request))
        elif isinstance(request, (CreateTopicRequest, ReloadConfRequest)):
            self._begin()
            self._to_lane(request, 0, batchable=False)
        elif isinstance(request, _QUERIES):
            self._start(self._admin, request)
        elif isinstance(request, DiscoverTopologyRequest):
            self._outbox.put_nowait(self._conn.send(admin.discover_topology(request)))
            self._counter.inc("discover_topology")
        elif kind is Ping:
            self._counter.inc("ping")
        else:
            self._counter.inc(_NAMES.get(kind, kind.__name__), False)
            raise CloseConnection("refused", _REFUSED.get(kind, f"{kind.__name__} not served"))

    def _produce_pass(self, produce: ProducePass) -> None:
        """A Produce as the read's pass made it: straight to the backend, answered with a
        frame built from the outcomes; through the records when the lane or the access
        policy has a say."""
        self._begin_received()
        if self._lane.busy or not self._access.open:
            self._produce_request(produce.as_request(), produce.size)
            return
        size = produce.size
        self._produce_bytes += size

        def done(outcomes: list[ProduceOutcome]) -> None:
            self._produce_bytes -= size
            response, ok = produce_response_frame(produce.request_id, produce.layout,
                                                  outcomes)
            self._outbox.put_nowait(response)
            self._counter.inc("produce", ok)
            self._end()
            if ok and self.fast_produce and len(produce.batches) == 1:
                batch = produce.batches[0]
                self._learn_appender(batch.topic, batch.partition)

        self._backend.produce_nowait(produce.batches, done)

    def _produce_request(self, request: AnyProduce, size: int) -> None:
        if self._lane.busy or topics_to_look_up(
                self._access, (t.name for t in request.topics), self._auto_create):
            # Behind a CreateTopic or ReloadConf (keep the order), or its topics must
            # be looked up first (the policy refuses their creation).
            self._to_lane(request, size, batchable=True)
        else:
            self._produce_now(request, size)

    # ------------------------------------------------------------- requests in flight

    def _start(self, handler: Callable[[R, *Args], Awaitable[None]], request: R,
               *args: *Args) -> None:
        assert self._nursery is not None
        self._begin()
        self._nursery.start_soon(self._guarded, handler, request, *args)

    async def _guarded(self, handler: Callable[[R, *Args], Awaitable[None]], request: R,
                       *args: *Args) -> None:
        try:
            await handler(request, *args)
        except Exception as exc:  # a backend failure ends this connection, not the server
            self._failed(request, exc)
        finally:
            self._end()

    def _failed(self, request: object, exc: Exception) -> None:
        kind = _NAMES.get(type(request), type(request).__name__)
        self._counter.inc(kind, False)
        self._log.error("tank_request_failed", request=kind, error=repr(exc))
        self._closing(CloseConnection("backend_error", f"{kind}: {exc!r}"))

    # ------------------------------------------------------------------------ handlers

    async def _consume(self, request: ConsumeRequest, asked: list[FetchRequest],
                       hidden: set[str] | None) -> None:
        with trio.CancelScope() as poll:
            if self._stopping:
                poll.cancel()
            if self._polls is None:
                self._polls = set()
            self._polls.add(poll)
            try:
                outcomes = await self._backend.fetch(access.visible(asked, hidden),
                                                     max_wait_ms=request.max_wait_ms,
                                                     min_bytes=request.min_bytes)
            finally:
                self._polls.discard(poll)
            self._reply_consume(request, asked, access.with_hidden(asked, hidden, outcomes))

    def _reply_consume(self, request: ConsumeRequest, asked: list[FetchRequest],
                       outcomes: list[FetchOutcome]) -> None:
        reply = consume_reply(request, outcomes)
        self._outbox.put_consume_nowait(reply.head, reply.chunks)
        lag = self._metrics.reader_lag
        for fetch, outcome in zip(asked, outcomes, strict=True):
            if outcome.status is FetchStatus.DATA:
                where = (fetch.topic, fetch.partition)
                if self._read_partitions is None:
                    self._read_partitions = set()
                self._read_partitions.add(where)
                at = fetch.seq if 0 < fetch.seq < UINT64_MAX else (
                    outcome.resolved_seq or outcome.base_seq or outcome.first_available)
                lag.update((self, where), "tank", fetch.topic, fetch.partition, at,
                           outcome.high_water_mark)
        if reply.bytes_by_topic:
            metrics = self._metrics
            for topic, size in reply.bytes_by_topic.items():
                metrics.for_topic(metrics.bytes_out, topic).inc(size)
            quota = self._quota
            if quota is not None and quota.out_limited:
                quota.took_out(sum(reply.bytes_by_topic.values()))
        self._counter.inc("consume", reply.ok)

    async def _admin(self, request: admin.AdminRequest) -> None:
        kind = type(request)
        response = None
        if not self._access.open:
            try:
                response = access.refused_admin(self._access, request, _NAMES[kind])
            except CloseConnection as close:
                self._counter.inc(_NAMES[kind], False)
                self._closing(close)
                return
        if response is None:
            response = await admin.answer(self._backend, request)
            if isinstance(response, DiscoverTopicsResponse):
                response = access.visible_topics(self._access, response)
        self._outbox.put_nowait(self._conn.send(response))
        self._counter.inc(_NAMES[type(request)], getattr(response, "error", 0) == 0)

    def _to_lane(self, request: LaneRequest, size: int, *, batchable: bool) -> None:
        """Queue ``request`` in the ordered lane; start its task if none serves it."""
        self._lane.put_nowait(request, size, batchable=batchable)
        if not self._lane_served:
            assert self._nursery is not None
            self._lane_served = True
            self._nursery.start_soon(self._serve_lane)

    async def _serve_lane(self) -> None:
        """Serve the lane until it is empty."""
        lane = self._lane
        try:
            while (next_batch := lane.next_batch()) is not None:
                batch, size = next_batch
                first = batch[0]
                try:
                    if isinstance(first, _PRODUCES):
                        # Only Produces are batchable: a batch is Produces or one request.
                        await self._produce(cast(list[AnyProduce], batch))
                    else:
                        await self._admin(first)
                except Exception as exc:
                    self._failed(first, exc)
                    return
                finally:
                    lane.done(size)
                    self._end(len(batch))
        finally:
            self._lane_served = False

    def _produce_now(self, request: AnyProduce, size: int) -> None:
        """Hand a Produce to the backend at once (written before the next request is
        read); it is answered when the backend reports its outcomes."""
        if self._access.open:
            batches, merge = produce_batches(request), None
        else:
            batches, merge = access.guarded_produce(self._access, request, self._auto_create,
                                                    _NAMES[type(request)])
            if not batches:  # every topic refused
                self._answer_produce(request, merge([]) if merge else [])
                self._end()
                return
        self._produce_bytes += size

        def done(outcomes: list[ProduceOutcome]) -> None:
            self._produce_bytes -= size
            self._answer_produce(request, merge(outcomes) if merge else outcomes)
            self._end()

        self._backend.produce_nowait(batches, done)

    def _answer_produce(self, request: AnyProduce, outcomes: list[ProduceOutcome]) -> None:
        self._outbox.put_nowait(self._conn.send(produce_response(request, outcomes)))
        self._counter.inc(_NAMES[type(request)], all_ok(outcomes))

    async def _produce(self, requests: list[AnyProduce]) -> None:
        """Append consecutive Produce requests (that waited in the lane) with one backend
        call, answer each."""
        guarded = not self._access.open
        if guarded:
            await look_up(self._access, self._backend, topics_to_look_up(
                self._access, (t.name for r in requests for t in r.topics),
                self._auto_create))
        spans = []
        merges = []
        batches = []
        for request in requests:
            if guarded:
                mine, merge = access.guarded_produce(self._access, request,
                                                     self._auto_create, _NAMES[type(request)])
            else:
                mine, merge = produce_batches(request), None
            spans.append(len(mine))
            merges.append(merge)
            batches += mine
        outcomes = await self._backend.produce(batches) if batches else []
        start = 0
        for request, n, merge in zip(requests, spans, merges, strict=True):
            got = outcomes[start:start + n]
            self._answer_produce(request, merge(got) if merge else got)
            start += n
