"""Two servers side by side for the shared-read tests: one sharing the reads of the long
polls an append wakes (the default), one reading for every reader (the reference), each
with the same access policy, fed the same bundles; raw frames to compare."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway.backend.embedded import EmbeddedBackend
from gateway.client.tank import open_tank_client
from gateway.server.run import ServerInfo
from protocols.tank.bundle import Codec, Message, encode_bundle
from tests.auth.helpers import LOOPBACK, policy_server

#: The Tank and Kafka listeners may write and create anything, and read ``pub*`` only:
#: ``secret`` is hidden from their readers.
POLICY = """
[[rule]]
who = ["listener:tank", "listener:kafka"]
topics = ["*"]
allow = ["publish", "create"]
[[rule]]
who = ["listener:tank", "listener:kafka"]
topics = ["pub*"]
allow = ["subscribe"]
"""

_TANK_HEAD = struct.Struct("<BI")


def backend_of(info: ServerInfo) -> EmbeddedBackend:
    assert isinstance(info.backend, EmbeddedBackend)
    return info.backend


@asynccontextmanager
async def shared_and_reference(tmp_path: Path, **settings: Any
                               ) -> AsyncIterator[tuple[ServerInfo, ServerInfo]]:
    """``(sharing server, reference server)``, each with topics ``pub`` (2 partitions)
    and ``secret`` (1), and ``settings`` besides the policy."""
    async with AsyncExitStack() as stack:
        servers = []
        for name in ("shared", "reference"):
            (tmp_path / name).mkdir()
            info, _ = await stack.enter_async_context(policy_server(
                tmp_path / name, POLICY, kafka_listen=LOOPBACK, **settings))
            servers.append(info)
        backend_of(servers[1]).shared_reads = None
        for info in servers:
            assert info.tank is not None
            async with open_tank_client(*info.tank) as client:
                await client.create_topic("pub", 2)
                await client.create_topic("secret", 1)
        yield servers[0], servers[1]


def bundle(first: int, count: int, size: int = 40, codec: Codec = Codec.NONE) -> bytes:
    """A bundle of ``count`` messages with fixed timestamps (the same bytes every time)."""
    return encode_bundle([Message(b"m%06d" % (first + i) + b"." * size, b"k%d" % i,
                                  1_700_000_000_000 + first + i) for i in range(count)],
                         codec=codec)


async def append(servers: tuple[ServerInfo, ...], topic: str, partition: int,
                 data: bytes) -> None:
    """Produce ``data`` (one bundle) to every server."""
    for info in servers:
        assert info.tank is not None
        async with open_tank_client(*info.tank) as client:
            await client.produce_bundles({(topic, partition): data})


async def read_exactly(stream: trio.SocketStream, buf: bytearray, size: int) -> bytes:
    """``size`` bytes from ``buf`` and then ``stream``."""
    while len(buf) < size:
        data = await stream.receive_some(65536)
        assert data, "the server closed the connection"
        buf += data
    out = bytes(buf[:size])
    del buf[:size]
    return out


async def tank_frame(stream: trio.SocketStream, buf: bytearray) -> bytes:
    """The next whole Tank frame that is not a Ping, header included."""
    while True:
        head = await read_exactly(stream, buf, _TANK_HEAD.size)
        msg_id, size = _TANK_HEAD.unpack(head)
        frame = head + await read_exactly(stream, buf, size)
        if msg_id != 0x03:  # the server's Ping
            return frame


async def kafka_frame(stream: trio.SocketStream, buf: bytearray) -> bytes:
    """The next whole Kafka frame, size included."""
    head = await read_exactly(stream, buf, 4)
    return head + await read_exactly(stream, buf, struct.unpack(">i", head)[0])


#: ``read_frame(stream, buffer)``: the next whole frame of one protocol.
FrameReaderFn = Callable[[trio.SocketStream, bytearray], Awaitable[bytes]]


class Reader:
    """One connection to each server, sending both the same frames."""

    def __init__(self, streams: list[trio.SocketStream], read_frame: FrameReaderFn) -> None:
        self.streams = streams
        self.bufs = [bytearray() for _ in streams]
        self._read_frame = read_frame

    async def send(self, frame: bytes) -> None:
        for stream in self.streams:
            await stream.send_all(frame)

    async def frames(self) -> list[bytes]:
        """The next frame from each server (sharing, reference)."""
        return [await self._read_frame(s, b)
                for s, b in zip(self.streams, self.bufs, strict=True)]

    async def aclose(self) -> None:
        for stream in self.streams:
            await stream.aclose()


async def open_readers(servers: tuple[ServerInfo, ...], count: int,
                       address: Callable[[ServerInfo], tuple[str, int] | None],
                       read_frame: FrameReaderFn) -> list[Reader]:
    """``count`` readers, each connected to ``address(server)`` of every server."""
    readers = []
    for _ in range(count):
        streams = []
        for info in servers:
            where = address(info)
            assert where is not None
            streams.append(await trio.open_tcp_stream(*where))
        readers.append(Reader(streams, read_frame))
    return readers


async def answered_after_append(servers: tuple[ServerInfo, ...], readers: list[Reader],
                                requests: list[bytes], parked: int, data: bytes
                                ) -> list[bytes]:
    """Send ``requests[i]`` on ``readers[i]``: those past the first ``parked`` must be
    answered at once; once every poll has parked, append ``data`` to ``pub/0``. Every
    frame must be the same from both servers; returns the parked readers' answers."""
    for reader, frame in zip(readers, requests, strict=True):
        await reader.send(frame)
    for reader in readers[parked:]:
        shared, reference = await reader.frames()
        assert shared == reference
    await trio.sleep(0.3)  # every long poll parked on both servers
    await append(servers, "pub", 0, data)
    answers = []
    for reader in readers[:parked]:
        shared, reference = await reader.frames()
        assert shared == reference
        answers.append(shared)
    return answers
