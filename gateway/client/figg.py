"""An async (trio) Figg client with the behaviour the Figg protocol describes.

::

    async with open_figg_client("127.0.0.1", 8119) as client:
        await client.publish("orders", b"hello")            # waits only for window space
        await client.publish_and_wait("orders", b"sure")    # waits for the ACK
        sub = await client.subscribe("orders", from_offset=0)
        async for message in sub:                           # FiggMessage(topic, offset, data)
            ...

What it does for you:

- reconnects forever with a pluggable backoff (default: first redial immediate, then
  1, 2, 4, 8, 16 s capped at 30 s, each times a jitter in [0.8, 1.2)) and reports
  :class:`ConnectionState` changes to ``on_state_change``. The backoff starts over only
  after a connection proved useful (an ACK, DATA, a first ATTACHED, DETACHED, PONGs);
- gives up when the server keeps refusing a request: ``max_refusals`` connections in a
  row on which the server answered the opening PING, then closed before answering the
  first request, raise
  :class:`~gateway.client.errors.RequestRefused` from every waiting call (a Figg
  server closes the connection on a request it refuses); a server that sends bytes
  that are not Figg raises :class:`~gateway.client.errors.BadResponse` at once;
- sends PING every ``ping_interval`` seconds and drops the connection when
  ``max_missed_pings`` in a row are unanswered;
- keeps a window of ``window`` unacknowledged publishes (:meth:`FiggClient.publish`
  waits while it is full); ACK(n) releases every publish up to n;
- on every connection it sends, in order: a PING (unless ``max_refusals`` is None),
  pending ATTACHes, ATTACH(resume, last offset) for attached topics, pending DETACHes,
  then every unacknowledged PUBLISH (at-least-once);
- DETACH is resent until DETACHED arrives.

Offsets are opaque: the client only hands the last one it received back to the server.
Messages of a subscription wait in a bounded buffer; while it is full the client stops
reading the connection (the server then stops reading the log for it), so iterate your
subscriptions.
"""

from __future__ import annotations

import enum
import math
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Final, TypedDict, Unpack

import structlog
import trio
from trio.lowlevel import ParkingLot, checkpoint_if_cancelled

from gateway.client.errors import (
    BadResponse,
    ClientClosed,
    ClientError,
    ConnectError,
    RequestRefused,
    os_reason,
)
from gateway.client.lone import running
from gateway.client.tls import PathLike, client_context, open_stream, tls_failure
from gateway.io.backoff import Backoff, ExponentialBackoff
from gateway.io.errors import socket_errors
from gateway.io.limits import RECEIVE_SIZE
from gateway.io.writer import FrameWriter
from protocols.connection import CLOSED, DEFAULT_MAX_FRAME, Role
from protocols.errors import ProtocolError, TruncatedFrame
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import (
    ATTACH_FROM_OFFSET,
    FAST,
    Ack,
    Attached,
    Data,
    Detached,
    MessageType,
    Pong,
)

log = structlog.get_logger("figtank.client.figg")

__all__ = [
    "Backoff", "BadResponse", "ClientClosed", "ClientError", "ConnectionState",
    "ExponentialBackoff", "FiggClient", "FiggMessage", "FiggOptions", "RequestRefused",
    "Subscription", "open_figg_client",
]

DEFAULT_WINDOW: Final = 256
DEFAULT_PING_INTERVAL: Final = 2.0
DEFAULT_MAX_MISSED_PINGS: Final = 2
#: Connections in a row the server may end without answering before the client gives up.
DEFAULT_MAX_REFUSALS: Final = 3
#: Messages a subscription iterator hands out from its buffer before it yields.
_CHECKPOINT_EVERY: Final = 256

_encode_attach = FAST[MessageType.ATTACH].encode_frame
_encode_detach = FAST[MessageType.DETACH].encode_frame
_encode_publish = FAST[MessageType.PUBLISH].encode_frame
_encode_ping = FAST[MessageType.PING].encode_frame


class ConnectionState(enum.Enum):
    """What ``on_state_change`` is called with."""

    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True, slots=True)
class FiggMessage:
    """One DATA: ``offset`` names the message (hand it back to resume after it)."""

    topic: str
    offset: int
    data: bytes


class _SubState(enum.Enum):
    ATTACHING = "attaching"
    ATTACHED = "attached"


class Subscription:
    """Messages of one attached topic: ``async for message in subscription``.

    Iteration ends after :meth:`aclose` (or the client closing). ``last_offset`` is the
    offset of the last message the application took (or the one ATTACHED reported
    before any): hand it to another consumer (Figg ATTACH, or Tank at ``last_offset + 1``)
    to continue exactly after it.
    """

    def __init__(self, client: FiggClient, topic: str, from_offset: int | None,
                 buffer: int) -> None:
        self.topic = topic
        self._client = client
        self._topic_bytes = topic.encode()
        self._flags = 0 if from_offset is None else ATTACH_FROM_OFFSET
        self._offset = from_offset or 0
        self._state = _SubState.ATTACHING
        self._attached = trio.Event()
        self._send, self._receive = trio.open_memory_channel[FiggMessage](buffer)
        #: Offset ATTACHED reported for the first attachment (None until then).
        self.start_offset: int | None = None
        self.last_offset: int | None = None
        # The offset of the last message received from the server (possibly still
        # buffered): where a reconnect resumes.
        self._received_offset: int | None = None
        self._streak = 0

    @property
    def attached(self) -> bool:
        return self._state is _SubState.ATTACHED

    async def wait_attached(self) -> None:
        """Wait for the first ATTACHED."""
        await self._attached.wait()

    def _attach_frame(self) -> bytes:
        if self._state is _SubState.ATTACHED and self._received_offset is not None:
            return _encode_attach(ATTACH_FROM_OFFSET, self._topic_bytes,
                                  self._received_offset)
        return _encode_attach(self._flags, self._topic_bytes, self._offset)

    def _on_attached(self, offset: int) -> None:
        self._state = _SubState.ATTACHED
        self._received_offset = offset
        if self.start_offset is None:
            self.start_offset = offset
            self.last_offset = offset
        self._attached.set()

    def _end(self) -> None:
        self._send.close()
        self._attached.set()

    async def receive(self) -> FiggMessage:
        """The next message; ``trio.EndOfChannel`` once the subscription has ended (the
        client's failure instead, when the client gave up)."""
        with self._failure_at_end():
            return self._took(await self._receive.receive())

    def receive_nowait(self) -> FiggMessage:
        """The next buffered message, or ``trio.WouldBlock``."""
        with self._failure_at_end():
            return self._took(self._receive.receive_nowait())

    @contextmanager
    def _failure_at_end(self) -> Iterator[None]:
        """The subscription ended: raise the client's failure instead, if it gave up."""
        try:
            yield
        except trio.EndOfChannel:
            self._client._raise_failure()
            raise

    def _took(self, message: FiggMessage) -> FiggMessage:
        self.last_offset = message.offset
        return message

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> FiggMessage:
        # Buffered messages are handed out without a trip through the scheduler (the
        # cost of iterating would otherwise dwarf everything else); every
        # _CHECKPOINT_EVERY messages, and whenever the buffer is empty, it does yield.
        self._streak += 1
        if self._streak < _CHECKPOINT_EVERY:
            try:
                message = self._receive.receive_nowait()
                self.last_offset = message.offset
                return message
            except trio.WouldBlock:
                pass
            except (trio.EndOfChannel, trio.ClosedResourceError):
                self._client._raise_failure()
                raise StopAsyncIteration from None
        self._streak = 0
        try:
            message = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._client._raise_failure()
            raise StopAsyncIteration from None
        self.last_offset = message.offset
        return message

    async def aclose(self) -> None:
        """Detach (waits for DETACHED, resending it across reconnects)."""
        await self._client.unsubscribe(self.topic)


class _Pending:
    """One unacknowledged publish."""

    __slots__ = ("frame", "on_ack", "seq", "topic")

    def __init__(self, seq: int, topic: str, frame: bytes,
                 on_ack: Callable[[int], object] | None) -> None:
        self.seq = seq
        self.topic = topic
        self.frame = frame
        self.on_ack = on_ack


class _Disconnect(Exception):
    """Ends the current connection; its message is the reason logged."""


#: The connection's socket failures.
_RECEIVE_ERRORS: Final = socket_errors("receive", _Disconnect)
_SEND_ERRORS: Final = socket_errors("send", _Disconnect)


class _Link:
    """One TCP connection: the frames waiting to be written on it, and its liveness."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        # No direct writes: a burst of publishes goes out as one write.
        self.out = FrameWriter(stream, direct=False)
        #: Queue a frame on this connection.
        self.send: Callable[[bytes], None] = self.out.put_nowait
        self.missed_pings = 0
        #: Whether the server answered something new: an ACK, DATA, the first ATTACHED
        #: of a subscription, DETACHED, or a PONG after the first (re-ATTACHED after a
        #: reconnect is not).
        self.useful = False
        self.pongs = 0
        #: Topics whose ATTACH(resume) this connection answered.
        self.reattached: set[str] = set()
        #: Set when the server sent bytes that are not Figg.
        self.bad_frame: ProtocolError | None = None
        #: Set when the server stopped answering PINGs (it did not refuse anything).
        self.silent = False
        #: Set when the TLS layer ended the connection (the server refused the client's
        #: certificate just after the handshake, in TLS 1.3): why.
        self.tls_refused: str | None = None
        self.reason = ""
        self.scope: trio.CancelScope | None = None

    def fail(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason
        if self.scope is not None:
            self.scope.cancel()


class FiggOptions(TypedDict, total=False):
    """:class:`FiggClient`'s keyword arguments, for what passes them on."""

    window: int
    ping_interval: float
    max_missed_pings: int
    backoff: Backoff | None
    on_state_change: Callable[[ConnectionState], object] | None
    connect_timeout: float
    subscription_buffer: int
    max_frame_size: int
    max_refusals: int | None
    first_connect_attempts: int | None
    ssl_context: ssl.SSLContext | None
    tls: bool
    ca: PathLike | None
    cert: PathLike | None
    key: PathLike | None


class FiggClient:
    """A Figg client; run it with :func:`open_figg_client` (or ``nursery.start(run)``).

    TLS: ``ssl_context``, or ``tls=True`` (the system's CAs) with ``ca``, ``cert``,
    ``key`` file paths (:func:`gateway.client.tls.client_context`).

    Every timing parameter is injectable so tests run fast: ``ping_interval``,
    ``max_missed_pings``, ``backoff`` (any callable ``attempt -> seconds``),
    ``connect_timeout``. ``on_state_change`` is called with a :class:`ConnectionState`.
    ``max_refusals`` (None: never give up) bounds the connections in a row the server
    may end without answering anything while requests wait. ``first_connect_attempts``
    (None: forever) bounds the attempts to connect the first time, after which waiting
    calls raise :class:`~gateway.client.errors.ConnectError`; once connected, the client
    reconnects forever.
    """

    def __init__(self, host: str, port: int, *, window: int = DEFAULT_WINDOW,
                 ping_interval: float = DEFAULT_PING_INTERVAL,
                 max_missed_pings: int = DEFAULT_MAX_MISSED_PINGS,
                 backoff: Backoff | None = None,
                 on_state_change: Callable[[ConnectionState], object] | None = None,
                 connect_timeout: float = 10.0, subscription_buffer: int = 4096,
                 max_frame_size: int = DEFAULT_MAX_FRAME,
                 max_refusals: int | None = DEFAULT_MAX_REFUSALS,
                 first_connect_attempts: int | None = None,
                 ssl_context: ssl.SSLContext | None = None, tls: bool = False,
                 ca: PathLike | None = None, cert: PathLike | None = None,
                 key: PathLike | None = None) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.host = host
        self.port = port
        self.window = window
        self.ping_interval = ping_interval
        self.max_missed_pings = max_missed_pings
        self.backoff: Backoff = backoff or ExponentialBackoff()
        self.on_state_change = on_state_change
        self.connect_timeout = connect_timeout
        self.subscription_buffer = subscription_buffer
        self.max_frame_size = max_frame_size
        self.max_refusals = max_refusals
        self.first_connect_attempts = first_connect_attempts
        #: TLS (None: plain TCP): ``ssl_context``, or one made of ``ca``, ``cert`` and
        #: ``key`` when any is given or ``tls`` is set (:func:`~gateway.client.tls.client_context`).
        self.ssl_context = ssl_context or (
            client_context(ca=ca, cert=cert, key=key) if tls or ca or cert or key else None)
        #: Why the last connection attempt failed (None after a success).
        self.last_connect_error: str | None = None
        self.state = ConnectionState.DISCONNECTED
        #: Successful connections so far.
        self.connections = 0
        #: Whether the server ever sent a frame (a Figg server answers PINGs at least).
        self.answered = False
        self._link: _Link | None = None
        self._seq = 0
        self._unacked: deque[_Pending] = deque()
        self._window_space = ParkingLot()
        self._subs: dict[str, Subscription] = {}
        self._detaching: dict[str, trio.Event] = {}
        self._connected = ParkingLot()
        self._delivering = False
        self._closed = False
        self._failure: ClientError | None = None
        self._waiting: set[trio.Event] = set()
        self._run_scope: trio.CancelScope | None = None

    # ------------------------------------------------------------------ public API

    @property
    def unacked(self) -> int:
        """Publishes sent (or waiting to be) and not yet acknowledged."""
        return len(self._unacked)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> ClientError | None:
        """Why the client gave up (:class:`RequestRefused`, :class:`BadResponse`), if it did."""
        return self._failure

    async def wait_connected(self) -> None:
        """Wait until the client is connected."""
        while self.state is not ConnectionState.CONNECTED:
            self._check_open()
            await self._connected.park()
        await trio.lowlevel.checkpoint()

    async def publish(self, topic: str, data: bytes,
                      on_ack: Callable[[int], object] | None = None) -> int:
        """Publish ``data``; returns its sequence number.

        Waits only while the window of unacknowledged publishes is full. ``on_ack(seq)`` is
        called (from the client's reader task, keep it short) once the server has stored
        the message. Unacknowledged publishes are resent after a reconnect.
        """
        await checkpoint_if_cancelled()
        while len(self._unacked) >= self.window:
            self._check_open()
            await self._window_space.park()
        self._check_open()
        self._seq += 1
        seq = self._seq
        frame = _encode_publish(topic.encode(), seq, data)
        self._unacked.append(_Pending(seq, topic, frame, on_ack))
        if self._link is not None:
            self._link.send(frame)
        return seq

    async def publish_and_wait(self, topic: str, data: bytes) -> int:
        """Publish ``data`` and wait for its ACK; returns its sequence number."""
        done = trio.Event()
        acked = False

        def on_ack(_: int) -> None:
            nonlocal acked
            acked = True
            done.set()

        seq = await self.publish(topic, data, on_ack)
        await self._wait(done)
        if not acked:
            self._raise_failure()
            raise ClientClosed("the Figg client closed before the ACK")
        return seq

    async def wait_all_acked(self) -> None:
        """Wait until every publish so far is acknowledged."""
        if not self._unacked:
            await trio.lowlevel.checkpoint()
            return
        done = trio.Event()
        last = self._unacked[-1]
        previous = last.on_ack

        def chained(seq: int) -> None:
            if previous is not None:
                previous(seq)
            done.set()

        last.on_ack = chained
        await self._wait(done)
        if self._unacked and self._unacked[0].seq <= last.seq:
            self._raise_failure()
            raise ClientClosed("the Figg client closed before every ACK")

    async def subscribe(self, topic: str, *, from_offset: int | None = None,
                        wait: bool = True, buffer: int | None = None) -> Subscription:
        """Attach to ``topic``.

        ``from_offset=None``: only messages published from now on; ``0``: from the first
        available; ``X``: resume after the message whose offset was X. With ``wait`` the
        call returns once ATTACHED arrived (``subscription.start_offset`` says where the
        server started). ``buffer`` messages may wait in the subscription.
        """
        self._check_open()
        if topic in self._subs:
            raise ValueError(f"already subscribed to {topic!r}")
        sub = Subscription(self, topic, from_offset,
                           self.subscription_buffer if buffer is None else buffer)
        self._subs[topic] = sub
        superseded = self._detaching.pop(topic, None)
        if superseded is not None:
            superseded.set()
        if self._link is not None:
            self._link.send(sub._attach_frame())
        if wait:
            await sub.wait_attached()
            self._check_open()
        return sub

    async def unsubscribe(self, topic: str, *, wait: bool = True) -> None:
        """Detach from ``topic``: its subscription ends at once; DETACH is resent until
        DETACHED arrives, which ``wait`` waits for."""
        sub = self._subs.pop(topic, None)
        if sub is not None:
            sub._end()
        elif topic not in self._detaching:
            await trio.lowlevel.checkpoint()
            return
        done = self._detaching.setdefault(topic, trio.Event())
        if self._link is not None:
            self._link.send(_encode_detach(topic.encode()))
        if wait:
            await self._wait(done)
            if topic in self._detaching:
                self._raise_failure()
                raise ClientClosed("the Figg client closed before DETACHED")

    async def aclose(self) -> None:
        """Close the connection and stop reconnecting; waiting calls raise ClientClosed."""
        self._close()
        await trio.lowlevel.checkpoint()

    def _close(self) -> None:
        self._closed = True
        if self._run_scope is not None:
            self._run_scope.cancel()
        for sub in self._subs.values():
            sub._end()
        for event in self._waiting:
            event.set()
        self._window_space.unpark_all()
        self._connected.unpark_all()

    def _give_up(self, failure: ClientError) -> None:
        """Close the client because of ``failure``, which waiting calls then raise."""
        log.info("figg_client_gave_up", host=self.host, port=self.port, error=str(failure))
        self._failure = failure
        self._close()

    # ------------------------------------------------------------- connection loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Connect, serve, reconnect with backoff, until :meth:`aclose` or cancellation."""
        with trio.CancelScope() as scope:
            self._run_scope = scope
            task_status.started()
            attempt = refusals = 0
            while not self._closed:
                delay = self.backoff(attempt)
                if delay > 0:
                    await trio.sleep(delay)
                attempt += 1
                try:
                    with trio.fail_after(self.connect_timeout):
                        stream = await open_stream(self.host, self.port, self.ssl_context)
                except (OSError, trio.TooSlowError) as exc:
                    self.last_connect_error = (os_reason(exc) if isinstance(exc, OSError)
                                               else f"no answer within {self.connect_timeout:g} s")
                    log.debug("figg_connect_failed", host=self.host, port=self.port,
                              error=self.last_connect_error, attempt=attempt)
                    if (not self.connections and self.first_connect_attempts is not None
                            and attempt >= self.first_connect_attempts):
                        self._give_up(ConnectError(f"could not connect to {self._server}: "
                                                   f"{self.last_connect_error}"))
                    continue
                self.last_connect_error = None
                link = await self._serve(stream)
                if self._closed:
                    break
                if link.tls_refused is not None and not self.answered:
                    # Refused by TLS right after the handshake: a failed connection.
                    self.last_connect_error = f"the server refused TLS: {link.tls_refused}"
                    log.debug("figg_connect_failed", host=self.host, port=self.port,
                              error=self.last_connect_error, attempt=attempt)
                    if (self.first_connect_attempts is not None
                            and attempt >= self.first_connect_attempts):
                        self._give_up(ConnectError(f"could not connect to {self._server}: "
                                                   f"{self.last_connect_error}"))
                    continue
                # A working connection lost is worth a warning; a refused one is not
                # (the client reports refusals as RequestRefused).
                (log.warning if link.useful else log.info)(
                    "figg_disconnected", host=self.host, port=self.port, reason=link.reason)
                if link.bad_frame is not None:
                    self._give_up(BadResponse(
                        f"{self._server} sent bytes that are not Figg ({link.bad_frame}): "
                        f"is it a Figg port?"))
                elif link.useful:
                    attempt = refusals = 0  # the server served us: redial at once
                elif (link.pongs and not link.silent
                      and (unanswered := self._unanswered(link)) is not None):
                    refusals += 1
                    if self.max_refusals is not None and refusals >= self.max_refusals:
                        self._give_up(RequestRefused(*unanswered, self._server, refusals))
        self._closed = True

    @property
    def _server(self) -> str:
        return f"{self.host}:{self.port}"

    def _unanswered(self, link: _Link) -> tuple[str, str] | None:
        """The first request (in the order a connection sends them) ``link`` left
        unanswered, as (operation, topic); None when nothing was asked."""
        subs = self._subs.values()
        for sub in subs:
            if not sub.attached:
                return "subscribe", sub.topic
        for sub in subs:
            if sub.topic not in link.reattached:
                return "subscribe", sub.topic
        for topic in self._detaching:
            return "unsubscribe", topic
        if self._unacked:
            return "publish", self._unacked[0].topic
        return None

    async def _serve(self, stream: trio.abc.Stream) -> _Link:
        link = _Link(stream)
        try:
            async with trio.open_nursery() as nursery:
                link.scope = nursery.cancel_scope
                self._link = link
                # Before any other task can send on the link: resume in protocol order.
                for frame in self._resume_frames():
                    link.send(frame)
                self.connections += 1
                self._set_state(ConnectionState.CONNECTED)
                nursery.start_soon(self._reader, link)
                nursery.start_soon(self._writer, link)
                if self.ping_interval and math.isfinite(self.ping_interval):
                    nursery.start_soon(self._pinger, link)
        finally:
            self._link = None
            self._delivering = False
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            if self.state is ConnectionState.CONNECTED:
                self._set_state(ConnectionState.DISCONNECTED)
        return link

    def _resume_frames(self) -> list[bytes]:
        subs = list(self._subs.values())
        # With refusal detection on, a PING goes first: a server that answers it is up
        # and speaks Figg, so closing before answering what follows is a refusal; a
        # proxy whose server is down never answers it (an outage: keep redialling).
        frames = [] if self.max_refusals is None else [_encode_ping(time.time_ns())]
        frames += [s._attach_frame() for s in subs if not s.attached]
        frames += [s._attach_frame() for s in subs if s.attached]
        frames += [_encode_detach(t.encode()) for t in self._detaching]
        frames += [p.frame for p in self._unacked]
        return frames

    def _set_state(self, state: ConnectionState) -> None:
        self.state = state
        if state is ConnectionState.CONNECTED:
            self._connected.unpark_all()
        if self.on_state_change is not None:
            try:
                self.on_state_change(state)
            except Exception:
                log.exception("figg_state_callback_failed")

    async def _wait(self, event: trio.Event) -> None:
        """Wait for ``event``, which :meth:`aclose` also sets (callers check why)."""
        self._check_open()
        self._waiting.add(event)
        try:
            await event.wait()
        finally:
            self._waiting.discard(event)

    def _check_open(self) -> None:
        if self._closed:
            self._raise_failure()
            raise ClientClosed("the Figg client is closed")

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # ----------------------------------------------------------------------- tasks

    async def _writer(self, link: _Link) -> None:
        try:
            with _SEND_ERRORS:
                await link.out.run()
        except _Disconnect as exc:
            link.fail(str(exc))

    async def _pinger(self, link: _Link) -> None:
        while True:
            await trio.sleep(self.ping_interval)
            if self._delivering:
                continue  # our reader is waiting on the application, not on the server
            if link.missed_pings >= self.max_missed_pings:
                link.silent = True
                link.fail(f"{link.missed_pings} pings unanswered")
                return
            link.missed_pings += 1
            link.send(_encode_ping(time.time_ns()))

    async def _reader(self, link: _Link) -> None:
        conn = FiggConnection(Role.CLIENT, max_frame_size=self.max_frame_size)
        try:
            while True:
                with _RECEIVE_ERRORS:
                    data = await link.stream.receive_some(RECEIVE_SIZE)
                conn.receive_data(data)
                while events := conn.next_events():
                    await self._handle(link, events)
        except TruncatedFrame as exc:  # the connection died mid-frame: redial
            link.fail(str(exc))
        except ProtocolError as exc:
            link.bad_frame = exc
            link.fail(f"bad frame from the server: {exc}")
        except _Disconnect as exc:
            link.tls_refused = tls_failure(exc)
            link.fail(str(exc))

    async def _handle(self, link: _Link, events: list[Any]) -> None:
        if events[0] is not CLOSED:
            self.answered = True
        acked = 0
        for event in events:
            kind = type(event)
            if acked and kind is not Ack:
                self._release(acked)  # before anything that may wait on the application
                acked = 0
            if kind is Data:
                sub = self._subs.get(event.topic)
                if sub is None or not sub.attached:
                    continue  # detached meanwhile
                message = FiggMessage(event.topic, event.offset, event.data)
                try:
                    sub._send.send_nowait(message)
                except trio.WouldBlock:
                    self._delivering = True
                    try:
                        await sub._send.send(message)
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        continue
                    finally:
                        self._delivering = False
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    continue
                sub._received_offset = event.offset
                link.useful = True
            elif kind is Ack:
                acked = max(acked, event.seq_num)
            elif kind is Pong:
                link.missed_pings = 0
                link.pongs += 1
                if link.pongs > 1:
                    link.useful = True
            elif kind is Attached:
                sub = self._subs.get(event.topic)
                if sub is not None:
                    if sub.attached:
                        link.reattached.add(event.topic)
                    else:
                        link.useful = True
                    sub._on_attached(event.offset)
            elif kind is Detached:
                if event.topic not in self._subs:
                    done = self._detaching.pop(event.topic, None)
                    if done is not None:
                        link.useful = True
                        done.set()
            elif event is CLOSED:
                raise _Disconnect("server closed the connection")
        if acked:
            self._release(acked)
            link.useful = True

    def _release(self, seq_num: int) -> None:
        """ACK(n): every publish up to n is stored."""
        unacked = self._unacked
        released = 0
        while unacked and unacked[0].seq <= seq_num:
            pending = unacked.popleft()
            released += 1
            if pending.on_ack is not None:
                try:
                    pending.on_ack(pending.seq)
                except Exception:
                    log.exception("figg_ack_callback_failed", seq=pending.seq)
        if released:
            self._window_space.unpark_all()


@asynccontextmanager
async def open_figg_client(host: str, port: int,
                           **options: Unpack[FiggOptions]) -> AsyncIterator[FiggClient]:
    """Run a :class:`FiggClient` in the background for the ``async with`` block.

    The client connects (and reconnects) on its own; use ``wait_connected()`` if you
    need the connection up. ``options`` are :class:`FiggClient`'s keyword arguments.
    """
    client = FiggClient(host, port, **options)
    async with running(client.run, client.aclose):
        yield client
