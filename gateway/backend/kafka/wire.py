"""One connection to one Kafka broker, with requests pipelined (trio).

:func:`open_broker` dials a broker (TCP, or TLS), learns the versions it speaks
(ApiVersions) and authenticates (SASL PLAIN or SCRAM, KIP-152's SaslAuthenticate), then
hands back a :class:`BrokerConnection`. :meth:`BrokerConnection.call` sends one request at
the highest version both sides speak and waits for its answer; any number of calls may be
in flight on one connection (the broker answers a connection's requests in order; the
answers are matched by correlation id). Requests go on the wire in the order they were
submitted (:meth:`BrokerConnection.submit`, synchronous): written to the socket at once
when it takes them (no task hand-off), else queued for the connection's writer task. One
task reads the answers (:meth:`BrokerConnection.run`). A request submitted with
``on_answer`` has its answer handed to that callback by the reader, with no task waiting
for it (the producer's Produce requests: no task and no wake-up per request); a watchdog
closes the connection when such an answer is late. When the connection is lost every
waiting call raises :class:`BrokerLost` (every callback gets it), and the connection is not
used again.

The messages are figtank's own (:mod:`protocols.kafka.records`, generated from Kafka's
message definitions): the client and the Kafka listener share one protocol layer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
import ssl
import struct
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import structlog
import trio

from gateway.io.reading import receive
from gateway.io.writer import Buffer, FrameWriter, socket_fd
from protocols.errors import ProtocolError
from protocols.kafka.messages import (
    REQUESTS,
    SUPPORTED_VERSIONS,
    decode_response_at,
    request_header_version,
    response_header_version,
)
from protocols.kafka.primitives import Parts
from protocols.kafka.produce_frames import ProduceTopics, produce_answers, produce_request
from protocols.kafka.records import (
    WRITERS,
    ApiVersionsRequest,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    encode_request_header,
    read_response_header,
)
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.record import Answer, Record, Request

#: The largest answer read (a Fetch's is bounded by the request's max_bytes).
MAX_FRAME: Final = 256 * 1024 * 1024
_SIZE: Final = struct.Struct(">i")
_READ: Final = 1024 * 1024
#: An answer at least this large is read to its end without going through the buffer.
_LARGE_ANSWER: Final = 256 * 1024


class _Closed(Exception):
    """The broker closed the connection (the reader's own signal)."""


#: Called with an answer's body, or with the error that means it will not come.
OnAnswer = Callable[[Any, BaseException | None], None]
#: Reads the body of an answer frame of a version (the frame: its size taken off, the
#: correlation id and header still in it).
DecodeFrame = Callable[[bytes, int], Any]


log = structlog.get_logger("figtank.upstream_kafka")


class BrokerLost(ConnectionError):
    """The connection to a broker failed, was closed, or an answer did not come in time."""


class AuthenticationFailed(BrokerLost):
    """The broker refused the gateway's credentials (SASL) or its TLS handshake failed."""


@dataclass(frozen=True, slots=True)
class Security:
    """How to reach the brokers: TLS (a client context) and SASL credentials."""

    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""


class Pending:
    """A request on its way: its answer (or error) once ``done`` is set, or handed to
    ``on_answer`` (then there is no ``done``) before ``deadline`` (trio time)."""

    __slots__ = ("api_key", "correlation", "deadline", "decode", "done", "error",
                 "on_answer", "result", "version")

    def __init__(self, api_key: int, version: int, correlation: int,
                 on_answer: OnAnswer | None = None, deadline: float = math.inf,
                 decode: DecodeFrame | None = None) -> None:
        self.api_key = api_key
        self.version = version
        self.correlation = correlation
        self.on_answer = on_answer
        self.deadline = deadline
        #: Reads the whole answer frame (header included) instead of the generated codec.
        self.decode = decode
        self.done = trio.Event() if on_answer is None else None
        #: The answer's body: a generated record, or what ``decode`` read.
        self.result: object = None
        self.error: BaseException | None = None


class BrokerConnection:
    """Pipelined requests over one stream; see the module doc."""

    def __init__(self, stream: trio.abc.Stream, address: str, *, client_id: str,
                 timeout: float) -> None:
        self.address = address
        self._stream = stream
        self._client_id = client_id
        self._client_id_bytes = client_id.encode()
        self.timeout = timeout
        self._correlation = 0
        self._pending: dict[int, Pending] = {}
        # direct: a request leaves in the submitting task when the socket takes it.
        self._writer = FrameWriter(stream, direct=True)
        # Cancelled by close(): the reader, the writer and the watchdog stop, and the
        # stream is closed.
        self._reading = trio.CancelScope()
        self._writing = trio.CancelScope()
        self._watching = trio.CancelScope()
        #: Set when a request is submitted: the watchdog waits on it while none is out.
        self._watch_idle = trio.Event()
        #: Why the connection is no longer usable (None while it is).
        self.lost: str | None = None
        #: What the broker serves: ``{api_key: (min, max)}``.
        self.versions: dict[int, tuple[int, int]] = {}

    def version(self, api_key: int) -> int:
        """The highest version of ``api_key`` both sides speak (:class:`BrokerLost` when
        there is none: the broker is too old or not a Kafka broker)."""
        ours = SUPPORTED_VERSIONS.get(api_key)
        theirs = self.versions.get(api_key)
        if ours is not None and theirs is not None:
            high = min(ours[1] if ours[1] is not None else ours[0], theirs[1])
            if high >= max(ours[0], theirs[0]):
                return high
        raise BrokerLost(f"{self.address} does not serve {ApiKey(api_key).name} in a "
                         f"version figtank speaks")

    def submit(self, api_key: int, body: Record, *, version: int | None = None,
               on_answer: OnAnswer | None = None, timeout: float | None = None) -> Pending:
        """Send one request after every request submitted before it, and return what its
        answer will land in (:meth:`wait`). Requests go on the wire in the order they are
        submitted, whichever task submits them: a producer relies on that for the order
        of a partition's batches.

        No answer within ``timeout`` (default the connection's) and the connection is
        closed (:meth:`watch`): a late answer could not be told from the next one's.
        With ``on_answer``, nobody waits: the reader calls ``on_answer(body, None)`` with
        the answer, or ``on_answer(None, error)`` once the connection is lost; never from
        within this call."""
        if self.lost is not None:
            raise BrokerLost(self.lost)
        if version is None:
            version = self.version(api_key)
        correlation = self._next_correlation()
        header = encode_request_header(
            RequestHeader(api_key, version, correlation, self._client_id),
            request_header_version(api_key, version))
        # Large values (a Produce's record batches) stay pieces of their own: sent as
        # they are, never copied into one payload.
        out = Parts()
        WRITERS[REQUESTS[api_key].name](body, out, version)
        pieces = [piece for piece in out.pieces() if piece]
        return self._send(api_key, version, correlation,
                          [_SIZE.pack(len(header) + sum(map(len, pieces))) + header, *pieces],
                          on_answer, timeout)

    def submit_produce(self, acks: int, timeout_ms: int, topics: ProduceTopics, *,
                       on_answer: OnAnswer, timeout: float | None = None) -> Pending:
        """:meth:`submit` of a Produce (no transactional id) built and, once answered,
        read in one call each (:mod:`protocols.kafka.produce_frames`): ``on_answer`` gets
        a list of :data:`~protocols.kafka.produce_frames.PartitionAnswer`."""
        if self.lost is not None:
            raise BrokerLost(self.lost)
        version = self.version(ApiKey.PRODUCE)
        correlation = self._next_correlation()
        frame = produce_request(version, correlation, self._client_id_bytes, acks,
                                timeout_ms, topics)
        return self._send(ApiKey.PRODUCE, version, correlation, frame, on_answer, timeout,
                          produce_answers)

    def _next_correlation(self) -> int:
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        return self._correlation

    def _send(self, api_key: int, version: int, correlation: int,
              frame: Sequence[Buffer], on_answer: OnAnswer | None,
              timeout: float | None, decode: DecodeFrame | None = None) -> Pending:
        pending = Pending(api_key, version, correlation, on_answer, trio.current_time() + (
            self.timeout if timeout is None else timeout), decode)
        self._pending[correlation] = pending
        if not self._watch_idle.is_set():
            self._watch_idle.set()
        self._writer.put_parts_nowait(frame)
        return pending

    async def wait(self, pending: Pending) -> Record:
        """The answer's body of a submitted request (:class:`BrokerLost` when the
        connection fails, or closes because no answer came in time: see :meth:`watch`)."""
        assert pending.done is not None, "an answer handed to on_answer is not waited for"
        try:
            await pending.done.wait()
        finally:
            self._pending.pop(pending.correlation, None)
        if pending.error is not None:
            raise pending.error
        assert isinstance(pending.result, Record)  # set with done, unless the error was
        return pending.result


    async def call(self, api_key: int, body: Request[Answer], *, version: int | None = None,
                   timeout: float | None = None) -> Answer:
        """Send one request and wait for its answer's body (:meth:`submit`, :meth:`wait`)."""
        answer = await self.wait(self.submit(api_key, body, version=version, timeout=timeout))
        return cast(Answer, answer)  # decode_response_at read the answer of api_key's request

    async def write(self) -> None:
        """Send what the socket did not take at once, in order, until the connection ends."""
        try:
            with self._writing:
                await self._writer.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.close(f"connection to {self.address} lost: {exc}")

    async def watch(self) -> None:
        """Close the connection when an answer is past its deadline: one timer per
        connection, not a cancel scope per request (every waiting call and callback then
        gets :class:`BrokerLost`). It sleeps until the earliest deadline, and while
        nothing is on its way, until a request is."""
        with self._watching:
            while self.lost is None:
                if not self._pending:
                    self._watch_idle = trio.Event()
                    await self._watch_idle.wait()
                    continue
                soonest = min(pending.deadline for pending in self._pending.values())
                if soonest > trio.current_time():
                    # A request submitted meanwhile with a shorter timeout is noticed by
                    # the next round (timeouts are seconds, and differ little).
                    await trio.sleep_until(soonest)
                    continue
                late = next(p for p in self._pending.values() if p.deadline <= soonest)
                self.close(f"no answer to {ApiKey(late.api_key).name} from "
                           f"{self.address} in time")

    async def run(self) -> None:
        """Read answers until the connection ends (then every waiting call fails)."""
        buffer = bytearray()
        try:
            with self._reading:
                await self._read(buffer)
        finally:
            self.close(self.lost or "closed")
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._stream)

    async def _read(self, buffer: bytearray) -> None:
        fd = socket_fd(self._stream)  # a plain socket is read directly (TLS: the stream)

        async def more(size: int) -> bytes | bytearray:
            data = await (receive(fd, size) if fd >= 0 else self._stream.receive_some(size))
            if not data:
                raise _Closed
            return data

        try:
            while self.lost is None:
                buffer += await more(_READ)
                self._answers(buffer)
                if len(buffer) >= 4:
                    (size,) = _SIZE.unpack_from(buffer, 0)
                    if size >= _LARGE_ANSWER:  # (_answers refused a size over MAX_FRAME)
                        # The rest of a large answer (a Fetch's megabytes) is read up to
                        # its end and joined once: not appended to the buffer and then
                        # copied out of it.
                        parts: list[bytes | bytearray] = [buffer[4:]]
                        left = size + 4 - len(buffer)
                        while left > 0:
                            parts.append(await more(min(left, _READ)))
                            left -= len(parts[-1])
                        buffer.clear()
                        self._answer(b"".join(parts))
        except _Closed:
            self.close(f"{self.address} closed the connection")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.close(f"connection to {self.address} lost: {exc}")
        except ProtocolError as exc:
            self.close(f"bad answer from {self.address}: {exc}")

    def _answers(self, buffer: bytearray) -> None:
        pos = 0
        end = len(buffer)
        view = memoryview(buffer)
        try:
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(buffer, pos)
                if not 0 <= size <= MAX_FRAME:
                    raise ProtocolError(f"answer of {size} bytes")
                if end - pos - 4 < size:
                    break
                frame = bytes(view[pos + 4:pos + 4 + size])
                pos += 4 + size
                self._answer(frame)
        finally:
            view.release()
        del buffer[:pos]

    def _answer(self, frame: bytes) -> None:
        if len(frame) < 4:
            raise ProtocolError("answer too short for its header")
        (correlation,) = _SIZE.unpack_from(frame, 0)
        pending = self._pending.get(correlation)
        if pending is None:
            return  # a call that gave up (timeout, cancelled): its answer is dropped
        try:
            if pending.decode is not None:
                pending.result = pending.decode(frame, pending.version)
            else:
                _, pos = read_response_header(frame, 0, len(frame), response_header_version(
                    pending.api_key, pending.version))
                pending.result = decode_response_at(pending.api_key, frame, pos,
                                                    pending.version)
        except ProtocolError as exc:
            pending.error = BrokerLost(f"bad answer to {ApiKey(pending.api_key).name} "
                                       f"from {self.address}: {exc}")
        if pending.done is not None:
            pending.done.set()
            return
        del self._pending[correlation]
        _hand_over(pending)

    def close(self, reason: str) -> None:
        """Stop using the connection: every waiting call raises :class:`BrokerLost`."""
        if self.lost is None:
            self.lost = reason
        self._reading.cancel()
        self._writing.cancel()
        self._watching.cancel()
        self._writer.close()
        handed: list[Pending] = []
        for correlation, pending in list(self._pending.items()):
            if pending.done is None:
                del self._pending[correlation]
                pending.error = BrokerLost(self.lost)
                handed.append(pending)
            elif not pending.done.is_set():
                pending.error = BrokerLost(self.lost)
                pending.done.set()
        for pending in handed:
            _hand_over(pending)

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._pending)


def _hand_over(pending: Pending) -> None:
    """Give a request's answer (or error) to its ``on_answer``."""
    assert pending.on_answer is not None
    try:
        pending.on_answer(pending.result, pending.error)
    except Exception:  # one caller's bug must not end the connection for the others
        log.exception("upstream_answer_callback_failed",
                      api=ApiKey(pending.api_key).name)


async def open_broker(host: str, port: int, nursery: trio.Nursery, *, security: Security,
                      client_id: str, timeout: float) -> BrokerConnection:
    """A connection to ``host:port``, its versions learnt and SASL done, its reader
    running in ``nursery``. :class:`BrokerLost` (or :class:`AuthenticationFailed`) when
    it can not be had within ``timeout``."""
    address = f"{host}:{port}"
    try:
        with trio.fail_after(timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    except trio.TooSlowError:
        raise BrokerLost(f"cannot connect to {address}: no answer in {timeout:g} s") from None
    except OSError as exc:
        raise BrokerLost(f"cannot connect to {address}: {exc.strerror or exc}") from None
    if security.ssl_context is not None:
        stream = trio.SSLStream(stream, security.ssl_context, server_hostname=host)
        try:
            with trio.fail_after(timeout):
                await stream.do_handshake()
        except (trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
            await trio.aclose_forcefully(stream)
            reason = exc.__cause__ or exc
            raise AuthenticationFailed(f"TLS handshake with {address} failed: "
                                       f"{reason}") from None
    connection = BrokerConnection(stream, address, client_id=client_id, timeout=timeout)
    nursery.start_soon(connection.run)
    nursery.start_soon(connection.write)
    nursery.start_soon(connection.watch)
    try:
        answer = await connection.call(ApiKey.API_VERSIONS, ApiVersionsRequest(), version=0)
        if answer.error_code:
            raise BrokerLost(f"{address} refused ApiVersions: {error_name(answer.error_code)}")
        connection.versions = {k.api_key: (k.min_version, k.max_version)
                               for k in answer.api_keys}
        if security.sasl_mechanism:
            await _authenticate(connection, security)
    except BaseException:
        connection.close("handshake failed")
        raise
    return connection


async def _authenticate(connection: BrokerConnection, security: Security) -> None:
    mechanism = security.sasl_mechanism
    answer = await connection.call(ApiKey.SASL_HANDSHAKE,
                                   SaslHandshakeRequest(mechanism=mechanism), version=1)
    if answer.error_code:
        raise AuthenticationFailed(
            f"{connection.address} does not enable SASL {mechanism} (it offers "
            f"{', '.join(answer.mechanisms) or 'none'})")
    if mechanism == "PLAIN":
        steps = _plain(security)
    else:
        steps = _Scram(mechanism, security.sasl_username, security.sasl_password).steps()
    token = next(steps)
    while True:
        reply = await connection.call(ApiKey.SASL_AUTHENTICATE,
                                      SaslAuthenticateRequest(auth_bytes=token))
        if reply.error_code:
            raise AuthenticationFailed(f"SASL authentication error: "
                                       f"{reply.error_message or error_name(reply.error_code)}")
        try:
            token = steps.send(bytes(reply.auth_bytes))
        except StopIteration:
            return


def _plain(security: Security) -> Generator[bytes, bytes, None]:
    yield b"\0" + security.sasl_username.encode() + b"\0" + security.sasl_password.encode()


class _Scram:
    """The client side of SCRAM (RFC 5802, 7677) as Kafka carries it."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self.hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.user = user.replace("=", "=3D").replace(",", "=2C")
        self.password = password.encode()
        self.nonce = base64.b64encode(secrets.token_bytes(18)).decode()

    def steps(self) -> Generator[bytes, bytes, None]:
        first_bare = f"n={self.user},r={self.nonce}"
        server_first = (yield ("n,," + first_bare).encode()).decode()
        attrs = dict(a.split("=", 1) for a in server_first.split(",") if "=" in a)
        if not attrs.get("r", "").startswith(self.nonce):
            raise AuthenticationFailed("SASL authentication error: the server's nonce "
                                       "does not extend the client's")
        salted = hashlib.pbkdf2_hmac(self.hash, self.password, base64.b64decode(attrs["s"]),
                                     int(attrs["i"]))
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = ",".join((first_bare, server_first, without_proof)).encode()
        client_key = hmac.digest(salted, b"Client Key", self.hash)
        signature = hmac.digest(hashlib.new(self.hash, client_key).digest(), auth_message,
                                self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_final = yield f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
        expected = hmac.digest(hmac.digest(salted, b"Server Key", self.hash), auth_message,
                               self.hash)
        if server_final != b"v=" + base64.b64encode(expected):
            raise AuthenticationFailed("SASL authentication error: the server's signature "
                                       "does not verify")


def error_name(code: int) -> str:
    """Kafka's name of an error code (``error N`` for one this package does not know)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"
