"""What both listeners' sessions share: read with backpressure, close for one reason, drain.

A :class:`Session` serves one accepted connection. :meth:`Session.run` runs the writer
task (the connection's :class:`~gateway.io.writer.FrameWriter`) and the protocol's own
tasks in one nursery and reads until one of:

- a clean EOF: what is in flight is finished and sent (up to :data:`DRAIN_SECS`), then
  the connection closes (``eof``);
- :meth:`Session.shutdown` (the server stops): reading stops, the same drain, ``shutdown``;
- a :class:`CloseConnection`, raised by the reader or recorded by a task with
  :meth:`Session._closing`: the first reason recorded is the one reported; closes whose
  kind is in :attr:`Session.DRAIN_ON` still drain (the socket works), the others close
  at once.

Two timers guard the reads (0 turns either off):

- ``frame_timeout``: a frame whose first bytes came and whose rest does not come within
  that long closes the connection (``frame_timeout``). The clock runs only while the
  session waits for the peer's bytes: time the session held the peer back (its output
  piling up) does not count.
- ``idle_timeout``: a connection that sends nothing for that long while it is not busy
  (:meth:`Session._busy`) and nothing is queued for it closes (``idle``). No task of the
  connection watches this: the listener's :class:`~gateway.serving.idling.IdleSweeper`
  looks at all its connections a few times per timeout (:meth:`Session.sweep`), so an
  idle connection costs no timer of its own.

The writer task runs only while there is something to write
(:meth:`~gateway.io.writer.FrameWriter.on_demand`; the sweeper lets an idle one end): an
idle connection is its reader task alone.

A connection whose principal has a quota (:class:`~gateway.auth.quotas.PrincipalQuota`)
takes the tokens of each read after handling it (bytes, and the requests it held:
:meth:`Session._request_count`) and waits before the next read until its debt is paid;
time held back by a quota counts as activity for neither timer.

A protocol's session says how it waits before reading (:meth:`Session._wait_readable`),
what it does with the bytes (:meth:`Session._received`), how much of a frame it holds
(:meth:`Session._buffered`), what "in flight" means (:meth:`Session._settle`,
:meth:`Session._busy`) and what its writer's failures mean (:attr:`Session.WRITE_ERRORS`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import ClassVar, Final

import trio

from gateway.auth.quotas import PrincipalQuota
from gateway.io.errors import ExceptionMap, socket_errors
from gateway.io.limits import RECEIVE_SIZE
from gateway.io.reading import receive
from gateway.io.writer import FrameWriter, socket_fd
from protocols.errors import FrameTooLarge, ProtocolError

#: Seconds a closing connection gets to send what it still owes (ACKs, replies).
DRAIN_SECS: Final = 5.0


class CloseConnection(Exception):
    """End the connection: ``kind`` is a short metric label, ``reason`` the logged text."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def bare(close: CloseConnection) -> CloseConnection:
    """``close`` without its traceback and the exceptions chained to it, to be kept: a
    raised close's traceback holds the frames of the session that raised it (``self``,
    its buffers), so keeping it whole would be a reference cycle that holds the closed
    connection's memory until the cycle collector happens to run."""
    close.__traceback__ = None
    close.__cause__ = close.__context__ = None
    return close


def protocol_close(exc: BaseException) -> CloseConnection:
    """The close a peer's protocol violation calls for."""
    kind = "frame_too_large" if isinstance(exc, FrameTooLarge) else "protocol_error"
    return CloseConnection(kind, str(exc))


#: Around parsing the peer's bytes: a protocol violation closes the connection.
PROTOCOL_ERRORS: Final = ExceptionMap((ProtocolError, protocol_close))
#: Around a read from the peer: a broken socket closes the connection.
RECEIVE_ERRORS: Final = socket_errors("receive", partial(CloseConnection, "reset"))
#: Around the writer task: a broken socket closes the connection.
SEND_ERRORS: Final = socket_errors("send", partial(CloseConnection, "send_failed"))


class Session:
    """One connection of a listener; see the module doc. Subclasses implement
    :meth:`_received` and may override the other hooks.

    Sessions have ``__slots__`` (so must their subclasses): ten thousand idle connections
    are ten thousand of them, and an instance dict of thirty-odd attributes is ~1.6 KB.
    """

    __slots__ = ("__weakref__", "_active_at", "_close", "_frame_timeout", "_idle_timeout",
                 "_last_read", "_nursery", "_outbox", "_quota", "_reading", "_stream",
                 "_throttling", "_unthrottled_at")

    #: Close kinds after which what is queued is still sent (the socket works).
    DRAIN_ON: ClassVar[frozenset[str]] = frozenset()
    #: What the writer task's failures mean.
    WRITE_ERRORS: ClassVar[ExceptionMap] = SEND_ERRORS

    #: The ``idle`` close's reason, formatted with the timeout.
    IDLE_REASON: ClassVar[str] = "nothing received for {:g} s with nothing in flight"

    def __init__(self, stream: trio.abc.Stream, outbox: FrameWriter, *,
                 frame_timeout: float = 0.0, idle_timeout: float = 0.0,
                 quota: PrincipalQuota | None = None) -> None:
        self._stream = stream
        self._outbox = outbox
        self._nursery: trio.Nursery | None = None
        self._close: CloseConnection | None = None
        #: Around the reads from the client: cancelled by shutdown().
        self._reading = trio.CancelScope()
        self._frame_timeout = _seconds(frame_timeout)
        self._idle_timeout = _seconds(idle_timeout)
        #: When the peer's last bytes were read.
        self._last_read = trio.current_time()
        #: The buckets of the connection's principal (None: no quotas on this server).
        self._quota = quota
        #: Whether the session is holding the peer back for its quota now, and when it
        #: last stopped doing so (the idle timer counts from then).
        self._throttling = False
        self._unthrottled_at = -math.inf
        #: When the idle sweeper last found the connection busy (that counts as activity).
        self._active_at = -math.inf

    @property
    def idle_timeout(self) -> float:
        """Seconds of inactivity after which the connection closes (``math.inf``: never)."""
        return self._idle_timeout

    @property
    def bytes_sent(self) -> int:
        return self._outbox.bytes_sent

    async def run(self) -> CloseConnection:
        """Serve the connection; returns why it ended. The caller closes the stream."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._outbox.on_demand(self._start_writer)
                self._start_tasks(nursery)
                try:
                    with self._reading:
                        await self._read()
                    if self._reading.cancelled_caught:
                        self._close = self._close or CloseConnection(
                            "shutdown", "server shutting down")
                    await self._drain()
                except CloseConnection as close:
                    self._close = self._close or bare(close)
                    drain = close.kind in self.DRAIN_ON
                    del close  # its traceback holds this frame
                    if drain:
                        await self._drain()
                nursery.cancel_scope.cancel()
        finally:
            self._outbox.close()  # no writer task may be left to do it
            self._ended()
        return self._close or CloseConnection("eof", "peer closed the connection")

    def shutdown(self) -> None:
        """The server is stopping: read nothing more from the client, finish and send what
        is in flight, then close. An idle connection closes at once."""
        self._reading.cancel()

    def _closing(self, close: CloseConnection) -> None:
        """Record the first reason to close and stop every task of the connection."""
        if self._close is None:
            self._close = bare(close)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _read(self) -> None:
        """Receive and handle input until a clean EOF (returns) or a reason to close."""
        stream = self._stream
        fd = socket_fd(stream)  # a plain socket is read directly: see receive()
        frame_timeout = self._frame_timeout
        received = 0  # bytes read so far
        frame_at = -1  # where the frame begun and not yet complete starts in the stream
        deadline = math.inf  # when that frame must be complete
        eager = False  # every other read of bytes already there skips the scheduler round
        while True:
            quota = self._quota  # may change: a Kafka SASL login changes the principal
            await self._wait_readable()
            size = RECEIVE_SIZE
            if quota is not None and quota.reads_limited:
                await self._throttle(quota.wait_in)
                size = quota.receive_size
            if deadline == math.inf:
                eager = not eager
                with RECEIVE_ERRORS:
                    data = await (receive(fd, size, eager) if fd >= 0
                                  else stream.receive_some(size))
            else:
                # The clock runs only while we wait for the peer, not while we hold it back.
                deadline += trio.current_time() - self._last_read
                with trio.move_on_at(deadline) as timer:
                    with RECEIVE_ERRORS:
                        data = await (receive(fd, size) if fd >= 0
                                      else stream.receive_some(size))
                if timer.cancelled_caught:
                    raise CloseConnection(
                        "frame_timeout", f"a frame begun {frame_timeout:g} s ago is not "
                        f"complete ({self._buffered()} bytes of it received)")
            self._last_read = now = trio.current_time()
            if quota is not None and quota.reads_limited:
                before = self._request_count()
                if await self._received(data):
                    return
                quota.took_in(len(data), self._request_count() - before)
            elif await self._received(data):
                return
            if frame_timeout == math.inf:
                continue
            received += len(data)
            pending = self._buffered()
            if not pending:
                frame_at, deadline = -1, math.inf
            elif received - pending != frame_at:  # a new frame began in this read
                frame_at, deadline = received - pending, now + frame_timeout

    async def _throttle(self, wait: Callable[[], Awaitable[None]]) -> None:
        """Hold the peer back for its quota (``wait``: the principal's)."""
        self._throttling = True
        try:
            await wait()
        finally:
            self._throttling = False
            self._unthrottled_at = trio.current_time()

    def _start_writer(self) -> None:
        """Start the writer task (the outbox asks when it has bytes to write)."""
        assert self._nursery is not None
        self._nursery.start_soon(self._write)

    async def _write(self) -> None:
        try:
            with self.WRITE_ERRORS:
                await self._outbox.run()
        except CloseConnection as close:
            self._closing(close)

    async def _drain(self) -> None:
        """Let what is in flight finish and what is queued go out, for up to DRAIN_SECS."""
        with trio.move_on_after(DRAIN_SECS):
            await self._settle()
            await self._outbox.wait_empty()

    def sweep(self, now: float) -> bool:
        """The idle sweeper's visit: let a parked writer task end, and close the connection
        (``idle``) if the peer sent nothing, the session was not busy and nothing was
        queued for its idle timeout up to ``now``; True if it closed. Found busy, that
        counts as activity: it gets a whole timeout after finishing."""
        timeout = self._idle_timeout
        outbox = self._outbox
        outbox.retire()
        if self._close is not None or timeout == math.inf:
            return False
        if self._busy() or outbox.queued_bytes or self._throttling:
            self._active_at = now
            return False
        last = max(self._idle_since(), outbox.drained_at, self._unthrottled_at,
                   self._active_at)
        if now < last + timeout:
            return False
        self._closing(CloseConnection("idle", self.IDLE_REASON.format(timeout)))
        return True

    # -------------------------------------------------------------------------- hooks

    def _start_tasks(self, nursery: trio.Nursery) -> None:
        """Start the protocol's own tasks beside the writer."""

    async def _wait_readable(self) -> None:
        """Backpressure: wait before the next read while output is piling up."""
        await self._outbox.wait_writable()

    async def _received(self, data: bytes | bytearray) -> bool:
        """Handle bytes from the peer (``b""``: EOF); True after a clean EOF. Raises
        :class:`CloseConnection` to close."""
        raise NotImplementedError

    async def _settle(self) -> None:
        """While closing: wait until what is in flight is answered (queued)."""

    def _buffered(self) -> int:
        """Bytes of a frame begun and not complete (after :meth:`_received`)."""
        return 0

    def _request_count(self) -> int:
        """Requests received so far (what a requests-per-second quota counts)."""
        return 0

    def _busy(self) -> bool:
        """Whether the connection has work that keeps it from being idle."""
        return False

    def _idle_since(self) -> float:
        """When the connection last showed activity (by default its last read)."""
        return self._last_read

    def _ended(self) -> None:
        """After the connection's tasks ended, whichever way."""


def _seconds(timeout: float) -> float:
    """A timeout setting as seconds: 0 (and inf, nan) mean never (``math.inf``)."""
    return timeout if timeout > 0 and math.isfinite(timeout) else math.inf
