"""A loopback TCP proxy between a Kafka client and figtank that loses Produce answers.

It forwards frames both ways; for the first ``drops`` Produce requests it forwards the
request, waits for figtank's answer (the batch is stored by then) and, instead of
passing the answer on, closes the client's connection: the client sees its request fail
after the broker stored it, and retries it. Point the client at :attr:`address` and make
figtank advertise that address (``kafka_advertised``), so that every connection the
client opens goes through the proxy.
"""

from __future__ import annotations

import struct

import trio

PRODUCE = 0


class _Frames:
    """Kafka frames (``int32 size | payload``) read off a stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = b""

    async def next(self) -> bytes | None:
        """The next whole frame, length prefix included; None at EOF."""
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack_from(">i", self.buf)[0]:
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                return None
            if not data:
                return None
            self.buf += data
        size = 4 + struct.unpack_from(">i", self.buf)[0]
        frame, self.buf = self.buf[:size], self.buf[size:]
        return frame


class DropProxy:
    """See the module docstring. Run :meth:`serve` in a nursery (``nursery.start``), then
    set :attr:`target` to figtank's Kafka address before the client connects."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        #: Produce answers lost so far.
        self.dropped = 0
        #: Connections the proxy accepted.
        self.connections = 0
        self.address: tuple[str, int] = ("127.0.0.1", 0)
        self.target: tuple[str, int] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = listeners[0].socket.getsockname()[:2]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        assert self.target is not None
        self.connections += 1
        upstream = await trio.open_tcp_stream(*self.target)
        doomed: set[int] = set()  # correlation ids whose answer is to be lost
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._requests, client, upstream, doomed, nursery.cancel_scope)
            nursery.start_soon(self._responses, upstream, client, doomed,
                               nursery.cancel_scope)

    async def _requests(self, client: trio.SocketStream, upstream: trio.SocketStream,
                        doomed: set[int], scope: trio.CancelScope) -> None:
        frames = _Frames(client)
        while (frame := await frames.next()) is not None:
            api_key, _, correlation_id = struct.unpack_from(">hhi", frame, 4)
            if api_key == PRODUCE and self.dropped + len(doomed) < self.drops:
                doomed.add(correlation_id)
            await upstream.send_all(frame)
        scope.cancel()

    async def _responses(self, upstream: trio.SocketStream, client: trio.SocketStream,
                         doomed: set[int], scope: trio.CancelScope) -> None:
        frames = _Frames(upstream)
        while (frame := await frames.next()) is not None:
            (correlation_id,) = struct.unpack_from(">i", frame, 4)
            if correlation_id in doomed:
                self.dropped += 1
                break  # the answer is lost with the connection
            try:
                await client.send_all(frame)
            except trio.BrokenResourceError:
                break
        scope.cancel()
