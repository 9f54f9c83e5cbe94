"""One Kafka connection on the server: requests served concurrently, answered in order.

Kafka clients expect the responses of a connection in request order, so every request
that gets an answer takes a slot in a queue when it is read; a slot's frame goes out
once every earlier one's has (a Fetch long poll holds back the answers behind it, as on
a Kafka broker). Produce is handed to the backend at once (written before the next
request is read) and answered when the append is durable; with acks=0 it gets no
answer. Every other request runs its handler (:data:`gateway.kafka.handlers.HANDLERS`)
in its own task.

Under a quota of its principal (:mod:`gateway.auth.quotas`) the connection's reads wait
for the bytes-in and requests tokens (:class:`~gateway.serving.session.Session`), and a
Fetch waits, before it is served, until the record bytes sent on earlier Fetches are paid
for (bytes out), as a Tank Consume does. A Fetch response carries in ``throttle_time_ms``
the wait its bytes put ahead of the principal (its bytes-out debt when it is sent): what
Kafka brokers since 2.0 report (KIP-219); clients that honour it (kafka-python, the Java
client) pause that long themselves, after which the server has nothing left to hold back,
and the others (librdkafka) are held back by the server. Reporting the wait already
imposed instead would make the first kind wait twice. Produce responses say 0: a read's
bytes-in and requests tokens are taken after the read is handled, often after the
Produce was answered, so the server holds the next read back instead.

Admission and limits are the Tank session's: ``limits.max_requests_in_flight``,
``limits.response_buffer_bytes`` and ``limits.unacked_bytes`` hold the connection back
(counted once per episode); ``limits.max_frame_bytes`` and malformed requests close this
connection only, with a log line. An API key this listener does not serve closes the
connection (as Kafka does), except a too-new ApiVersions, answered with
UNSUPPORTED_VERSION and the supported versions.

On a SASL listener the connection must authenticate first (:mod:`gateway.kafka.sasl`,
within ``limits.sasl_timeout_secs``); it then acts as its SASL user: its access, request
context and quota buckets are those of that principal.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import structlog
import trio

from gateway.auth.guard import OPEN, AccessGuard
from gateway.auth.principal import Principal
from gateway.auth.quotas import OUT, PrincipalQuota, Quotas
from gateway.core.contract import Backend, ProduceOutcome
from gateway.core.metrics import Metrics, RequestCounter
from gateway.core.sections import ConnectionLimits
from gateway.io.writer import JOIN_BELOW, Buffer, FrameWriter
from gateway.kafka.context import RequestContext
from gateway.kafka.fetch import SharedFetch
from gateway.kafka.handlers import HANDLERS
from gateway.kafka.produce import (
    ProducePlan,
    all_ok,
    plan_produce,
    produce_response,
    settle,
)
from gateway.kafka.sasl import SaslGate
from gateway.kafka.services import KafkaServices
from gateway.kafka.settings import KafkaSettings
from gateway.kafka.versions import SERVED, api_versions
from gateway.serving.listening import peer_host
from gateway.serving.lookup import look_up, topics_to_look_up
from gateway.serving.requests import RequestSession
from gateway.serving.session import PROTOCOL_ERRORS, CloseConnection
from protocols.connection import CLOSED, NEED_DATA
from protocols.kafka.connection import (
    KafkaServerConnection,
    Request,
    SaslToken,
    UnsupportedRequest,
)
from protocols.kafka.records import (
    ProduceRequest,
    ProduceResponse,
    SaslAuthenticateResponse,
    SaslHandshakeResponse,
)
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.record import replace as replace_record


def _name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return f"api_{api_key}"


class _Slot:
    """A response's place in the connection's order."""

    __slots__ = ("frame",)

    def __init__(self) -> None:
        #: The response: one frame's bytes, or its buffers (records not copied in).
        self.frame: bytes | Sequence[Buffer] | None = None


class KafkaSession(RequestSession[KafkaServerConnection]):
    """Serves one accepted Kafka connection until it closes; see :meth:`Session.run`."""

    IDLE_REASON = "no request for {:g} s with nothing in flight"
    #: A failed SASL exchange still sends its answer (the reason) before closing.
    DRAIN_ON = frozenset({"sasl_failed"})

    __slots__ = ("_access", "_backend", "_context", "_counter", "_deadline", "_guard",
                 "_order", "_produce_bytes", "_quotas", "_sasl", "_services", "_settings",
                 "_user_quota",
                 "principal")

    def __init__(self, stream: trio.abc.Stream, *, backend: Backend, settings: KafkaSettings,
                 limits: ConnectionLimits, metrics: Metrics, counter: RequestCounter,
                 log: structlog.typing.FilteringBoundLogger, advertised: tuple[str, int],
                 principal: Principal | None = None, guard: AccessGuard | None = None,
                 quota: PrincipalQuota | None = None, sasl: SaslGate | None = None,
                 quotas: Quotas | None = None, services: KafkaServices | None = None) -> None:
        super().__init__(stream, FrameWriter(stream, settings.response_buffer_bytes),
                         limits=limits, metrics=metrics, log=log, quota=quota)
        self._settings = settings
        #: Who the connection acts as (its listener, or its certificate's subject; its
        #: SASL user once authenticated).
        self.principal = principal or Principal("kafka")
        self._guard = guard or OPEN
        self._access = self._guard.connection(self.principal, log)
        #: The SASL exchange still to be done (None: none, or done).
        self._sasl = sasl
        self._quotas = quotas
        #: Quota buckets taken for the SASL user (given back when the session ends).
        self._user_quota: PrincipalQuota | None = None
        #: Around the wait for the SASL exchange (only on a SASL listener).
        self._deadline = trio.CancelScope() if sasl is not None else None
        self._backend = backend
        self._counter = counter
        #: The server-wide Kafka state (one for every connection and listener).
        self._services = services or KafkaServices.in_memory(settings, metrics)
        self._context = RequestContext(backend=backend, access=self._access,
                                       principal=self.principal, advertised=advertised,
                                       log=log, services=self._services,
                                       client_host=_peer(stream))
        self._conn = KafkaServerConnection(max_frame_size=limits.max_frame_bytes)
        self._order: deque[_Slot] | None = None  # made with the first request
        #: Bytes of Produce requests handed to the backend and not yet answered.
        self._produce_bytes = 0

    # ------------------------------------------------------------------------- reading

    async def _received(self, data: bytes | bytearray) -> bool:
        conn = self._conn
        conn.receive_data(data)
        while True:
            with PROTOCOL_ERRORS:
                event = conn.next_event()
            if event is NEED_DATA:
                return False
            if event is CLOSED:
                return True
            await self._admit_next()
            if self._sasl is not None:
                await self._before_authentication(event)
                continue
            # Raw SASL tokens come only while the exchange is under way (above).
            event = cast("Request | UnsupportedRequest", event)
            quota = self._quota
            if (quota is not None and quota.out_limited and not isinstance(
                    event, UnsupportedRequest) and event.api_key == ApiKey.FETCH):
                await self._throttle(quota.wait_out)
            if (not self._access.open and not isinstance(event, UnsupportedRequest)
                    and event.api_key == ApiKey.PRODUCE):
                await self._look_up(event.body)
            self._dispatch(event)

    async def _look_up(self, body: ProduceRequest) -> None:
        """Before a Produce under a policy: see which of its topics exist, so that one the
        backend would create is refused to a principal without ``create``."""
        await look_up(self._access, self._backend, topics_to_look_up(
            self._access, (t.name for t in body.topic_data), self._backend.auto_create.enabled))

    def _unacked_bytes(self) -> int:
        return self._produce_bytes

    def _dispatch(self, request: Request | UnsupportedRequest) -> None:
        self._received_request()
        key = request.api_key
        if isinstance(request, UnsupportedRequest) or key not in SERVED:
            if key == ApiKey.API_VERSIONS:
                # A newer client: tell it what is supported, in version 0 (as Kafka does).
                self._counter.inc("api_versions", False)
                slot = self._slot()
                self._fill(slot, self._conn.send(
                    request, api_versions(ErrorCode.UNSUPPORTED_VERSION), version=0))
                return
            self._counter.inc(_name(key), False)
            raise CloseConnection("unsupported", f"API key {key} ({_name(key)}) version "
                                  f"{request.api_version} is not served")
        if key == ApiKey.API_VERSIONS:
            self._fill(self._slot(), self._conn.send(request, api_versions()))
            self._counter.inc("api_versions")
        elif key == ApiKey.PRODUCE:
            self._produce(request)
        else:
            self._start(request)

    # ------------------------------------------------------------------------- SASL

    async def run(self) -> CloseConnection:
        try:
            return await super().run()
        finally:
            if self._user_quota is not None and self._quotas is not None:
                self._quotas.release(self._user_quota)

    def _start_tasks(self, nursery: trio.Nursery) -> None:
        timeout = self._settings.sasl_timeout_secs
        if self._sasl is not None and timeout > 0:
            nursery.start_soon(self._authentication_deadline, timeout)

    async def _authentication_deadline(self, timeout: float) -> None:
        assert self._deadline is not None
        with self._deadline:
            await trio.sleep(timeout)
        gate = self._sasl
        if gate is not None:
            self._closing(gate.failed(gate.mechanism or "none",
                                      f"not authenticated within {timeout:g} s"))

    async def _before_authentication(self, request: Request | UnsupportedRequest | SaslToken
                                     ) -> None:
        """Serve a request that came before the SASL exchange succeeded: ApiVersions and
        the exchange's own requests (or raw tokens, after a SaslHandshake v0); anything
        else closes the connection."""
        gate = self._sasl
        assert gate is not None
        if isinstance(request, SaslToken):
            await self._raw_token(gate, request.token)
            return
        key = request.api_key
        if isinstance(request, UnsupportedRequest) or key == ApiKey.API_VERSIONS:
            self._dispatch(request)
            return
        self._received_request()
        response: SaslHandshakeResponse | SaslAuthenticateResponse
        if key == ApiKey.SASL_HANDSHAKE:
            response, close = gate.handshake(request.body, request.api_version)
        elif key == ApiKey.SASL_AUTHENTICATE:
            response, close = await gate.authenticate(request.body)
        else:
            self._counter.inc(_name(key), False)
            raise CloseConnection("sasl_required", f"{_name(key)} before SASL "
                                  "authentication (only ApiVersions, SaslHandshake and "
                                  "SaslAuthenticate are served before it)")
        self._counter.inc(_name(key), close is None)
        self._fill(self._slot(), self._conn.send(request, response))
        if close is not None:
            raise close
        if gate.raw:  # SaslHandshake v0: the tokens come as raw frames
            self._conn.read_sasl_tokens()
        if gate.user is not None:
            self._authenticated(gate.user)

    async def _raw_token(self, gate: SaslGate, token: bytes) -> None:
        """A raw SASL token (after a SaslHandshake v0): answered with a raw frame; a
        failure closes the connection with no answer, as Kafka does."""
        self._received_request()
        answer, close = await gate.token(token)
        # Counted as the SaslAuthenticate request that carries a token after a v1 handshake.
        self._counter.inc("sasl_authenticate", close is None)
        if close is not None:
            raise close
        self._fill(self._slot(), self._conn.send_sasl_token(answer))
        if gate.user is not None:
            self._conn.read_requests()
            self._authenticated(gate.user)

    def _authenticated(self, user: str) -> None:
        """The SASL exchange succeeded: act as ``user`` from the next request on."""
        self._sasl = None
        if self._deadline is not None:
            self._deadline.cancel()
        self.principal = Principal(self.principal.listener, self.principal.identity, user)
        self._log = self._log.bind(user=user)
        self._access = self._guard.connection(self.principal, self._log)
        context = self._context
        context.principal, context.access, context.log = (self.principal, self._access,
                                                          self._log)
        if self._quotas is not None:
            self._user_quota = self._quota = self._quotas.acquire(self.principal)

    # ------------------------------------------------------------- answers in order

    def _slot(self) -> _Slot:
        slot = _Slot()
        if self._order is None:
            self._order = deque()
        self._order.append(slot)
        return slot

    def _fill(self, slot: _Slot, frame: bytes | Sequence[Buffer]) -> None:
        slot.frame = frame
        order = self._order
        assert order is not None  # the slot is in it
        outbox = self._outbox
        while order and order[0].frame is not None:
            ready = order.popleft().frame
            if isinstance(ready, bytes):
                outbox.put_nowait(ready)
            else:
                assert ready is not None
                outbox.put_parts_nowait(ready)
        if not order:
            self._order = None  # an idle connection holds no deque

    # ------------------------------------------------------------------------ handlers

    def _start(self, request: Request) -> None:
        assert self._nursery is not None
        context = self._context
        client_id = request.client_id or ""
        if client_id != context.client_id:
            # A new context, not a change to the one that tasks not yet run were given.
            context = self._context = replace(context, client_id=client_id)
        self._begin()
        self._nursery.start_soon(self._serve, request, self._slot(), context)

    async def _serve(self, request: Request, slot: _Slot, context: RequestContext) -> None:
        kind = _name(request.api_key)
        try:
            response = await HANDLERS[request.api_key](context, request.body,
                                                       request.api_version)
            quota = self._quota
            if type(response) is SharedFetch:  # one partition, from a shared read
                if quota is None or not quota.out_limited:
                    frame = self._conn.send_body_parts(request,
                                                       response.body(request.api_version))
                    # A small body is one piece: joined to the header, one frame.
                    self._fill(slot, frame[0] + frame[1] if len(frame) == 2
                               and len(frame[1]) < JOIN_BELOW else frame)
                    self._counter.inc(kind)
                    return
                response = response.record
            if quota is not None and quota.out_limited and request.api_key == ApiKey.FETCH:
                quota.took_out(sum(len(p.records or b"") for t in response.responses
                                   for p in t.partitions))
                response = replace_record(response,
                                          throttle_time_ms=quota.pending_ms(OUT))
            # Buffers: a Fetch response's records are written as they are, not copied.
            self._fill(slot, self._conn.send_parts(request, response))
            self._counter.inc(kind)
        except Exception as exc:  # a backend failure ends this connection, not the server
            self._counter.inc(kind, False)
            self._log.error("kafka_request_failed", request=kind, error=repr(exc))
            self._closing(CloseConnection("backend_error", f"{kind}: {exc!r}"))
        finally:
            self._end()

    def _produce(self, request: Request) -> None:
        body = request.body
        auto_create = self._backend.auto_create.enabled
        if body.acks not in (0, 1, -1):
            plan = plan_produce(body, self._access, self._settings.max_bundle_bytes,
                                auto_create)
            self._counter.inc("produce", False)
            self._fill(self._slot(), self._conn.send(request, _refused(
                plan, ErrorCode.INVALID_REQUIRED_ACKS)))
            return
        producers = self._services.producers
        plan = plan_produce(body, self._access, self._settings.max_bundle_bytes, auto_create,
                            producers)
        slot = None if body.acks == 0 else self._slot()
        self._begin()
        self._produce_bytes += plan.size

        def done(outcomes: list[ProduceOutcome]) -> None:
            settle(plan, outcomes, producers)
            plan.when_answerable(lambda: answer(outcomes))

        def answer(outcomes: list[ProduceOutcome]) -> None:
            self._produce_bytes -= plan.size
            response = produce_response(plan, outcomes)
            ok = all_ok(response)
            if not ok:
                self._context.refused("kafka_produce_refused", acks=body.acks, partitions=[
                    (t.name, p.index, p.error_code, p.error_message)
                    for t in response.responses for p in t.partition_responses
                    if p.error_code][:10])
            if slot is not None:
                self._fill(slot, self._conn.send(request, response))
            self._counter.inc("produce", ok)
            self._end()

        if plan.batches:
            self._backend.produce_nowait(plan.batches, done)
        else:
            done([])


def _peer(stream: trio.abc.Stream) -> str:
    """``/HOST`` of the client (as Kafka shows a member's host), or empty."""
    host = peer_host(stream)
    return "" if host is None else f"/{host}"


def _refused(plan: ProducePlan, code: int) -> ProduceResponse:
    for _, parts in plan.topics:
        for part in parts:
            part.error = part.error or code
    return produce_response(plan, [])
