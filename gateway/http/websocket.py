"""``GET /ws``: the Figg model over WebSocket, one JSON object per text message.

Client to server::

    {"op": "attach", "topic": "t", "partition": 0, "offset": 41}   resume after offset 41
    {"op": "attach", "topic": "t", "from": "earliest"}             (or "latest", the default)
    {"op": "detach", "topic": "t", "partition": 0}
    {"op": "publish", "topic": "t", "partition": 0, "key": "k", "value": "text",
     "id": 7}                                     (or "value_base64"; id: echoed in the ack)
    {"op": "ping", "ts": 123}

Server to client: ``{"op": "hello", "publish_window": N}`` first, then ``attached``
(``offset``: the position delivery starts after, as Figg's ATTACHED), ``data`` (a message:
``topic, partition, offset, timestamp, key/value``), ``detached``, ``ack`` (``id``,
``partition``, ``offset``: sent once the publish is durable) and ``pong``. Offsets are Tank
sequences (Figg offsets): attach with the offset of the last message delivered resumes
right after it.

The hello is sent before anything is read: what the client sent right after its upgrade
request (even in the same packet) is handled in order and answered after the hello.

Bad input closes the WebSocket with a close code and one ``websocket_closed`` log line:
1002 (a protocol violation wsproto found: a reserved opcode or RSV bit, an unmasked or
fragmented control frame), 1007 (not JSON, not UTF-8), 1008 (an unknown op, a field of
the wrong kind, access refused, more than ``http.ws_publish_window`` publishes
unacknowledged), 1009 (a message over ``http.max_body_bytes``), 1003 (a binary message).
A subscriber that falls behind is closed with 4000 and its position in the reason, to
attach again from it; one whose access a reload revoked (:mod:`gateway.http.revocation`)
with 4003 and why; one whose JWT expired with 4001 ``token expired``. An unexpected
error closes with 1011 (1013 when it was the upstream being away), never without a frame.
A failed upgrade is a 400 answer.

Every close the server starts sends its close frame: the writer task outlives the reader
and the subscriptions, and sends what was queued, the close frame last, before the
connection closes (the session then ends its side and drains the peer's, so that no reset
destroys the frame).

While the backend's upstream is away (:mod:`gateway.http.outage`) a publish or an attach
gets ``{"op": "error", "request": ..., "error": "unavailable", ...}`` and the socket goes
on; so it does when the store can not write (:mod:`gateway.http.faults`: ``"error":
"disk_full"``, ``"disk_read_only"`` or ``"disk_error"``, never a 1008 close: a server
fault, which the client tries again after ``retry_after_ms``). An attached subscription
gets ``{"op": "unavailable", ...}`` once, then ``{"op": "available", ...}`` and the
messages after its offset when the upstream is back.

Data frames count against the principal's bytes-out quota; while it is in debt no frame
is made for the socket (:mod:`gateway.http.quota`).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Final

import h11
import trio
import wsproto.events as ws
from prometheus_client import Counter
from wsproto import ConnectionType
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionState
from wsproto.utilities import LocalProtocolError, RemoteProtocolError, generate_accept_token

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.auth.quotas import PrincipalQuota
from gateway.backend.placed import produce_placed, reports_offsets
from gateway.core.contract import (
    BackendUnavailable,
    ProduceBatch,
    ProduceCode,
    ProduceDone,
    ProduceOutcome,
    TopicRefused,
    ensure_available,
)
from gateway.http.auth import access_of, bearer_token, partitions_of, require_some_access
from gateway.http.cursor import Behind, Cursor, Gone, Unavailable, wait_for_room
from gateway.http.faults import FAULT_STATUS, StoreFaultError
from gateway.http.messages import dumps, payload_of
from gateway.http.outage import FAILED_APPENDS, op_error, outage_of
from gateway.http.quota import owes, quota_of, took_out, wait_out
from gateway.http.request import HttpError, Request
from gateway.http.revocation import EXPIRED, REVOKED
from gateway.http.session import RECEIVE_SIZE, SOCKET_ERRORS, HttpSession
from gateway.http.tail import PartitionTail, TailEvent
from gateway.io.writer import FrameWriter, Owner
from protocols.tank.bundle import Message, encode_bundle
from protocols.topics import is_valid_topic_name

WRITE_BYTES: Final = 256 * 1024
#: Close codes (RFC 6455 and the private range).
UNSUPPORTED, INVALID, POLICY, TOO_BIG, BEHIND, GOING_AWAY = 1003, 1007, 1008, 1009, 4000, 1001
PROTOCOL_ERROR, INTERNAL_ERROR, TRY_AGAIN_LATER = 1002, 1011, 1013
#: How long the close frame (and what was queued before it) may take to leave.
CLOSE_DRAIN_SECS: Final = 1.0


class _Close(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


async def upgrade(session: HttpSession, request: Request) -> None:
    """Check the upgrade, answer 101 and serve the WebSocket until it closes.

    The origin (403) and the credentials (401 / 403) are checked before the upgrade
    headers: a ``GET /ws`` without them is a probe (figtank.js tells a refusal from an
    outage by it) whose answer is the refusal, or else 400 ``bad_upgrade``."""
    headers = request.headers
    upgrading = headers.get("upgrade", "").lower() == "websocket" and "upgrade" in (
        headers.get("connection", "").lower())
    try:
        session.listener.cors.check_websocket(request)
    except HttpError as refused:
        origin = headers.get("origin")
        if origin and not upgrading:
            # The probe of a page of a foreign origin: the page may read that it is
            # refused (nothing else), so that its client stops instead of retrying.
            refused.headers.append((b"access-control-allow-origin", origin.encode("latin-1")))
        raise
    access = access_of(session, request)
    require_some_access(session, access, "open a WebSocket")
    token = bearer_token(request)
    if not upgrading:
        raise HttpError(400, "bad_upgrade", "expected a WebSocket upgrade (Upgrade: "
                        "websocket, Connection: Upgrade)")
    if headers.get("sec-websocket-version") != "13" or not headers.get("sec-websocket-key"):
        raise HttpError(400, "bad_upgrade", "Sec-WebSocket-Version 13 and a "
                        "Sec-WebSocket-Key are required",
                        [(b"sec-websocket-version", b"13")])
    accept = generate_accept_token(headers["sec-websocket-key"].encode())
    conn = session.conn
    await session.send(conn.send(h11.InformationalResponse(status_code=101, headers=[
        (b"upgrade", b"websocket"), (b"connection", b"Upgrade"),
        (b"sec-websocket-accept", accept)])) or b"")
    trailing, _ = conn.trailing_data
    # The HTTP exchange is over: an idle WebSocket keeps neither its h11 state nor the
    # request's headers (memory per subscriber).
    session.end_http()
    request.headers.clear()
    listener = session.listener
    listener.streams["websocket"] += 1
    try:
        with quota_of(session, access.principal) as quota:
            socket = WebSocket(session, access, WsConnection(
                ConnectionType.SERVER, trailing_data=trailing), token, quota)
            with listener.open_streams.holding(socket):
                await socket.serve()
    finally:
        listener.streams["websocket"] -= 1


class _Subscription:
    """One attached partition of a WebSocket (the owner of its queued frames; at the tail,
    a follower its tail's reader feeds, through the tail's fan-out group while its socket
    is free)."""

    __slots__ = ("cursor", "delivered", "detached", "outbox", "quota", "scope")

    def __init__(self, cursor: Cursor, outbox: FrameWriter, delivered: Counter,
                 quota: PrincipalQuota | None = None) -> None:
        self.cursor = cursor
        self.outbox = outbox
        self.delivered = delivered
        self.quota = quota
        self.detached = False
        self.scope = trio.CancelScope()

    @property
    def next_seq(self) -> int:
        return self.cursor.next_seq

    @property
    def fanout_form(self) -> str | None:
        """Server frames are not masked: every WebSocket at a tail gets the same bytes;
        one whose principal has a bytes-out quota counts each write."""
        quota = self.quota
        return "ws" if quota is None or not quota.out_limited else None

    def encode(self, tail: PartitionTail, events: list[TailEvent]) -> bytes:
        return tail.joined("ws", events)

    def push(self, tail: PartitionTail, events: list[TailEvent]) -> bool:
        if self.detached or self.outbox.full or owes(self.quota):
            return False
        data = tail.joined("ws", events)
        self.outbox.put_nowait(data, self)
        took_out(self.quota, len(data))
        self.cursor.next_seq = events[-1].seq + 1
        self.delivered.inc(len(events))
        return True

    def settle(self, next_seq: int, sent: int) -> None:
        self.cursor.next_seq = next_seq
        self.outbox.bytes_sent += sent


class WebSocket:
    """One upgraded connection; see the module doc."""

    __slots__ = ("_closed", "_nursery", "_placing", "_text", "_text_size", "access", "conn",
                 "in_flight", "listener", "max_message", "outbox", "partitions", "principal",
                 "quota", "session", "subs", "token", "window")
    kind = "websocket"

    def __init__(self, session: HttpSession, access: ConnectionAccess, conn: WsConnection,
                 token: str | None = None, quota: PrincipalQuota | None = None) -> None:
        self.session = session
        self.listener = session.listener
        self.access = access
        #: Who it acts as, and the bearer token that said so (for a reload to look at).
        self.principal = access.principal
        self.token = token
        #: The principal's quota buckets (its data frames count as bytes out).
        self.quota = quota
        self.conn = conn
        settings = self.listener.settings
        self.outbox = FrameWriter(session.stream, settings.subscriber_buffer_bytes)
        self.max_message = settings.max_body_bytes
        self.window = settings.ws_publish_window
        self.in_flight = 0
        self.subs: dict[tuple[str, int], _Subscription] = {}
        self.partitions: dict[str, int] = {}
        self._text: list[str] = []
        self._text_size = 0
        self._closed: _Close | None = None
        self._nursery: trio.Nursery | None = None
        #: Publishes waiting to be placed (bridge mode), in order; None: no placer runs.
        self._placing: list[tuple[list[ProduceBatch], ProduceDone]] | None = None

    def send_json(self, value: object, owner: Owner | None = None) -> None:
        self.outbox.put_nowait(self.conn.send(ws.TextMessage(data=dumps(value).decode())),
                               owner)

    def close(self, code: int, reason: str) -> None:
        """Close with ``code`` (once): the close frame goes after what is queued."""
        if self._closed is not None:
            return
        self._closed = _Close(code, reason)
        if self.conn.state is ConnectionState.OPEN:
            self.outbox.put_nowait(self.conn.send(ws.CloseConnection(
                code=code, reason=reason.encode()[:120].decode(errors="ignore"))))
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def topics(self) -> set[str]:
        """The topics attached now."""
        return {topic for topic, _ in self.subs}

    def revoke(self, reason: str, *, expired: bool = False) -> None:
        """Access was revoked (a reload): close with :data:`REVOKED`; its token expired:
        with :data:`EXPIRED`."""
        self.close(EXPIRED if expired else REVOKED, reason)

    async def serve(self) -> None:
        session = self.session
        # The writer runs in the outer nursery, the reader and the subscriptions in the
        # inner one: a close cancels the inner one only, and the writer sends what is
        # queued, the close frame last, before the connection closes (cancelling it with
        # the rest would drop the frame, as right after the handshake, when nothing had
        # been written yet).
        # The hello goes out before anything is read, so whatever the client sent right
        # after the 101 (handled in order) is answered after it, acks (urgent) included.
        try:
            await session.send(self.conn.send(ws.TextMessage(data=dumps(
                {"op": "hello", "publish_window": self.window}).decode())))
        except SOCKET_ERRORS:
            session.ended("reset", "connection broken")
            return
        async with trio.open_nursery() as writing:
            writing.start_soon(self._write, writing.cancel_scope)
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self.listener.open_streams.watch_expiry(self, nursery)
                    with session.cancellable() as scope:
                        await self._read()
                    if scope.cancelled_caught and self._closed is None:
                        self.close(GOING_AWAY, "server shutting down")
                    nursery.cancel_scope.cancel()
            finally:
                for sub in self.subs.values():
                    self._end_sub(sub)
                self.subs.clear()
            if self._closed is not None:
                with trio.move_on_after(CLOSE_DRAIN_SECS):  # let the close frame out
                    await self.outbox.wait_empty()
            writing.cancel_scope.cancel()
        closed = self._closed
        if closed is not None:
            kind = {GOING_AWAY: "shutdown", BEHIND: "slow", REVOKED: "access_revoked",
                    TRY_AGAIN_LATER: "unavailable",
                    EXPIRED: "token_expired"}.get(closed.code, "websocket_close")
            routine = closed.code in (1000, 1001, 1005, 1006)  # ended normally or went away
            if routine and kind == "websocket_close":
                kind = "eof"
            level = session.log.info if routine else session.log.warning
            level("websocket_closed", code=closed.code, reason=closed.reason)
            session.ended(kind, f"{closed.code}: {closed.reason}")
        else:
            session.ended("eof", "websocket closed by the peer")

    async def _write(self, writing: trio.CancelScope) -> None:
        try:
            await self.outbox.run()
        except SOCKET_ERRORS:
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
            writing.cancel()

    async def _read(self) -> None:
        stream = self.session.stream
        ended = False
        while True:
            try:
                await self._events()  # first: the frames that came with the upgrade request
            except RemoteProtocolError as exc:
                self.close(exc.event_hint.code if isinstance(
                    exc.event_hint, ws.CloseConnection) else PROTOCOL_ERROR, str(exc))
                return
            except _Close as close:
                self.close(close.code, close.reason)
                return
            except Exception as exc:  # a bug must close the socket with 1011, not crash it
                self._crashed(exc)
                return
            if ended or self._closed is not None:
                return
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except SOCKET_ERRORS:
                return
            ended = not data
            # wsproto says bytes; it appends any buffer to its own.
            self.conn.receive_data(data or None)  # type: ignore[arg-type]

    def _crashed(self, exc: Exception) -> None:
        """Close after an unexpected error: 1013 when the backend's upstream is away (the
        client may try again later), else 1011 and the traceback in the log."""
        outage = outage_of(exc)
        if outage is not None:
            self.close(TRY_AGAIN_LATER, f"upstream unavailable: {outage}")
            return
        self.session.log.exception("websocket_internal_error", error=repr(exc))
        self.close(INTERNAL_ERROR, "internal error")

    async def _events(self) -> None:
        publishes: list[tuple[dict[str, Any], Message, int]] = []
        for event in self.conn.events():
            if isinstance(event, ws.TextMessage):
                self._text_size += len(event.data)
                if self._text_size > self.max_message:
                    self.listener.metrics.limit_hit("http_max_body_bytes")
                    raise _Close(TOO_BIG, f"message over {self.max_message} bytes")
                self._text.append(event.data)
                if not event.message_finished:
                    continue
                text = "".join(self._text)
                self._text, self._text_size = [], 0
                await self._message(text, publishes)
            elif isinstance(event, ws.BytesMessage):
                raise _Close(UNSUPPORTED, "binary messages are not served: send JSON text")
            elif isinstance(event, ws.Ping):
                self.outbox.put_urgent(self.conn.send(event.response()))
            elif isinstance(event, ws.CloseConnection):
                if self.conn.state is ConnectionState.OPEN:
                    # wsproto could not parse the client's frames (a reserved opcode or
                    # RSV bit, an unmasked or fragmented control frame, bad UTF-8): it
                    # names the code (1002, 1007, 1009); the close is ours to send.
                    raise _Close(event.code, event.reason or "protocol error")
                if self.conn.state is ConnectionState.REMOTE_CLOSING:
                    self.outbox.put_nowait(self.conn.send(event.response()))
                self._closed = _Close(event.code, event.reason or "closed by the client")
                break
        if publishes:
            self._publish(publishes)

    async def _message(self, text: str, publishes: list[tuple[dict[str, Any], Message, int]]
                       ) -> None:
        try:
            obj = json.loads(text)
        except ValueError:
            raise _Close(INVALID, "a message is not JSON") from None
        if not isinstance(obj, dict):
            raise _Close(INVALID, "a message is not a JSON object")
        op = obj.get("op")
        if op == "ping":
            self.send_json({"op": "pong", "ts": obj.get("ts")})
        elif op == "publish":
            if self.in_flight + len(publishes) >= self.window:
                self.listener.metrics.limit_hit("http_ws_publish_window")
                raise _Close(POLICY, f"more than {self.window} publishes unacknowledged")
            try:
                topic, partition = await self._where(obj, Operation.PUBLISH)
                try:
                    value = payload_of(obj, "value")
                    key = payload_of(obj, "key")
                except ValueError as exc:
                    raise _Close(POLICY, str(exc)) from None
                if value is None or (key is not None and len(key) > 255):
                    raise _Close(POLICY, "a publish needs a value (and a key of at most 255 "
                                 "bytes)")
                ensure_available(self.listener.backend)  # told now, not after its wait
            except BackendUnavailable as exc:
                self._unavailable("publish", obj, str(exc))
                return
            except StoreFaultError as exc:
                self._store_fault("publish", obj, exc)
                return
            publishes.append((obj, Message(value, key, int(time.time() * 1000)), partition))
        elif op == "attach":
            if publishes:  # what came before is appended first
                self._publish(publishes)
                publishes.clear()
            try:
                await self._attach(obj)
            except BackendUnavailable as exc:
                self._unavailable("attach", obj, str(exc))
            except StoreFaultError as exc:
                self._store_fault("attach", obj, exc)
        elif op == "detach":
            topic, partition = _topic_partition(obj)
            sub = self.subs.pop((topic, partition), None)
            if sub is not None:
                self._end_sub(sub)
            self.send_json({"op": "detached", "topic": topic, "partition": partition})
        else:
            raise _Close(POLICY, f"unknown op {str(op)[:40]!r}")

    def _unavailable(self, request: str, obj: dict[str, Any], reason: str) -> None:
        """One operation failed because the backend's upstream is away: tell the client
        (``{"op": "error", ...}``); the socket goes on."""
        topic, partition = _topic_partition(obj)
        self.send_json(op_error(request, obj, topic, partition, reason))
        self.listener.metrics.requests.labels("http", f"ws_{request}", "unavailable").inc()

    def _store_fault(self, request: str, obj: dict[str, Any], exc: StoreFaultError) -> None:
        """One operation failed because the store can not write (its topic could not be
        created): tell the client (``{"op": "error", "error": "disk_full", ...}``), which
        may try again later; the socket goes on."""
        topic, partition = _topic_partition(obj)
        self.send_json(op_error(request, obj, topic, partition, exc.message, exc.code))
        self.listener.metrics.requests.labels("http", f"ws_{request}", "error").inc()

    async def _where(self, obj: dict[str, Any], operation: Operation) -> tuple[str, int]:
        topic, partition = _topic_partition(obj)
        if not self.access.may(topic, operation):
            self.access.refused(topic, operation, f"websocket {operation.value}",
                                "close 1008")
            raise _Close(POLICY, f"{self.access.principal.name} may not {operation.value} "
                         f"{topic!r}")
        count = self.partitions.get(topic)
        if count is None:
            ensure_available(self.listener.backend)
            try:
                infos = await partitions_of(self.session, self.access, topic, "websocket")
            except StoreFaultError:
                raise  # not the client's fault: an error message, the socket goes on
            except HttpError as exc:
                raise _Close(POLICY, exc.message) from None
            count = len(infos)
            if len(self.partitions) < 1024:
                self.partitions[topic] = count
        if partition >= count:
            raise _Close(POLICY, f"topic {topic!r} has {count} partitions, not {partition}")
        return topic, partition

    # ------------------------------------------------------------------- publishing

    def _publish(self, publishes: list[tuple[dict[str, Any], Message, int]]) -> None:
        by_partition: dict[tuple[str, int], list[Message]] = {}
        for obj, message, partition in publishes:
            by_partition.setdefault((obj["topic"], partition), []).append(message)
        batches = [ProduceBatch(t, p, encode_bundle(m)) for (t, p), m in by_partition.items()]
        taken = list(publishes)
        self.in_flight += len(taken)

        def done(outcomes: list[ProduceOutcome]) -> None:
            self.in_flight -= len(taken)
            first = {}
            failed: dict[tuple[str, int], tuple[str, str]] = {}
            for batch, outcome in zip(batches, outcomes, strict=True):
                where = (batch.topic, batch.partition)
                if outcome.code in FAILED_APPENDS:  # not appended: the client may send it again
                    reason = self.listener.backend.unavailable()
                    error = ("unavailable" if reason else
                             FAULT_STATUS.get(outcome.fault, (0, "append_failed"))[1])
                    failed[where] = (error, f"publish to {batch.topic}/{batch.partition} "
                                     f"failed: {reason or outcome.reason or outcome.code.name}")
                elif outcome.code is not ProduceCode.OK:
                    self.close(POLICY, f"publish to {batch.topic}/{batch.partition} failed: "
                               f"{outcome.code.name.lower()}")
                    return
                else:
                    first[where] = outcome.first_seq
            if self.conn.state is not ConnectionState.OPEN:
                return  # closing: nothing more is sent
            seen: dict[tuple[str, int], int] = {}
            replies = []
            for obj, _, partition in taken:
                where = (obj["topic"], partition)
                if where in failed:
                    error, reason = failed[where]
                    replies.append(op_error("publish", obj, where[0], partition, reason,
                                            error))
                    continue
                index = seen.get(where, 0)
                seen[where] = index + 1
                offset = first[where] + index if first[where] else None
                replies.append({"op": "ack", "id": obj.get("id"), "topic": where[0],
                                "partition": partition, "offset": offset})
            self.outbox.put_urgent(b"".join(
                self.conn.send(ws.TextMessage(data=dumps(r).decode())) for r in replies))
            requests = self.listener.metrics.requests
            results: dict[str, int] = {}
            for r in replies:  # by outcome: ok, unavailable (the upstream), error
                result = ("ok" if r["op"] != "error" else
                          "unavailable" if r["error"] == "unavailable" else "error")
                results[result] = results.get(result, 0) + 1
            for result, n in results.items():
                requests.labels("http", "ws_publish", result).inc(n)

        backend = self.listener.backend
        if reports_offsets(backend):
            backend.produce_nowait(batches, done)
        else:
            self._place(batches, done)

    def _place(self, batches: list[ProduceBatch], done: ProduceDone) -> None:
        """Append through :func:`~gateway.backend.placed.produce_placed` (a backend that
        does not report offsets: a Tank upstream), one call after another, so the
        socket's publishes keep their order."""
        if self._placing is None:
            self._placing = []
            assert self._nursery is not None
            self._nursery.start_soon(self._placer)
        self._placing.append((batches, done))

    async def _placer(self) -> None:
        placing = self._placing
        assert placing is not None
        try:
            while placing:
                batches, done = placing.pop(0)
                done(await produce_placed(self.listener.backend, batches))
        except Exception as exc:  # a bug must close the socket with 1011, not crash it
            self._crashed(exc)
        self._placing = None

    # ------------------------------------------------------------------- subscribing

    async def _attach(self, obj: dict[str, Any]) -> None:
        topic, partition = await self._where(obj, Operation.SUBSCRIBE)
        sub = self.subs.get((topic, partition))
        if sub is not None:
            sub.cursor.tail.settle(sub)  # its position up to date
            self.send_json({"op": "attached", "topic": topic, "partition": partition,
                            "offset": sub.cursor.position})
            return
        if len(self.subs) >= self.listener.limits.max_requests_in_flight:
            raise _Close(POLICY, "too many subscriptions on one WebSocket")
        backend = self.listener.backend
        ensure_available(backend)
        infos = await backend.discover_partitions(topic)
        if infos is None:
            raise _Close(POLICY, str(TopicRefused(f"unknown topic {topic!r}")))
        info = infos[partition]
        first, tail_seq = max(info.first_available, 1), info.high_water_mark + 1
        offset = obj.get("offset")
        start = obj.get("from", "latest")
        if offset is not None:
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise _Close(POLICY, "offset must be an integer >= 0")
            # Past the end, the offset is not of this log (the topic was re-created): it
            # starts at the first message, and ``attached`` says so, rather than at the
            # end, skipping what the log has.
            next_seq = first if offset == 0 or offset >= tail_seq else max(offset + 1, first)
        elif start == "earliest":
            next_seq = min(first, tail_seq)
        elif start == "latest":
            next_seq = tail_seq
        else:
            raise _Close(POLICY, "from must be earliest or latest")
        tail = self.listener.tails.acquire(topic, partition, tail_seq)
        metrics = self.listener.metrics
        sub = _Subscription(Cursor(backend, tail, next_seq,
                                   self.listener.settings.subscriber_buffer_bytes),
                            self.outbox, metrics.for_topic(metrics.messages_out, topic),
                            self.quota)
        self.subs[(topic, partition)] = sub
        self.send_json({"op": "attached", "topic": topic, "partition": partition,
                        "offset": next_seq - 1})
        assert self._nursery is not None
        self._nursery.start_soon(self._deliver, sub)

    def _end_sub(self, sub: _Subscription) -> None:
        if not sub.detached:
            sub.detached = True
            sub.cursor.tail.unfollow(sub)  # the tail's group writes nothing more for it
            sub.scope.cancel()
            self.outbox.drop(sub)
            self.listener.tails.release(sub.cursor.tail)

    async def _deliver(self, sub: _Subscription) -> None:
        cursor = sub.cursor
        outbox = self.outbox
        tail = cursor.tail
        stall = self.listener.limits.idle_timeout_secs or math.inf
        delivered = sub.delivered
        with sub.scope:
            try:
                while True:
                    await wait_out(sub.quota)
                    await wait_for_room(outbox, stall)
                    try:
                        events = await cursor.take(WRITE_BYTES)
                    except Unavailable as exc:
                        await self._outage(sub, str(exc))
                        continue
                    if events:
                        data = tail.joined("ws", events)
                        outbox.put_nowait(data, sub)
                        took_out(sub.quota, len(data))
                        delivered.inc(len(events))
                        continue
                    if tail.next_seq > cursor.next_seq:
                        continue
                    released = None if outbox.full else tail.follow(sub)
                    if released is not None:  # fed by the tail's reader until released
                        try:
                            await released.wait()
                        finally:
                            tail.unfollow(sub)
                        continue
                    waker = trio.Event()
                    tail.wake_me(waker)
                    await waker.wait()
            except Behind as exc:
                self.listener.metrics.limit_hit(exc.limit)
                self.close(BEHIND, f"behind: {cursor.topic}/{cursor.partition} at offset "
                           f"{cursor.position}: {exc}")
            except Gone as exc:
                self.close(POLICY, str(exc))
            except LocalProtocolError:
                pass
            except Exception as exc:  # a bug must close the socket with 1011, not crash it
                self._crashed(exc)

    async def _outage(self, sub: _Subscription, reason: str) -> None:
        """The partition can not be read now: say so once, wait until it can, say so,
        and go on from the same offset."""
        cursor = sub.cursor
        where = {"topic": cursor.topic, "partition": cursor.partition}
        self.send_json({"op": "unavailable", **where, "offset": cursor.position,
                        "message": reason}, sub)
        await cursor.until_available()
        self.send_json({"op": "available", **where, "offset": cursor.position}, sub)


def _topic_partition(obj: dict[str, Any]) -> tuple[str, int]:
    topic = obj.get("topic")
    if not isinstance(topic, str) or not is_valid_topic_name(topic):
        raise _Close(POLICY, f"invalid topic {str(topic)[:70]!r}")
    partition = obj.get("partition", 0)
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise _Close(POLICY, "partition must be an integer >= 0")
    return topic, partition
