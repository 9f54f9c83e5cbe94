"""The ACK order of one connection's publishes when appends finish out of order."""

from __future__ import annotations

from typing import Any

from gateway.core.contract import ProduceCode, ProduceOutcome
from gateway.figg.offsets import figg_to_tank
from gateway.figg.publisher import AckQueue, Publishing
from protocols.connection import Role
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import Ack
from protocols.translate import PublishBatch
from tests.figg.helpers import publish


class HeldBackend:
    """Takes appends and completes them only when the test says (in any order)."""

    def __init__(self) -> None:
        self.pending: list[Any] = []

    def produce_nowait(self, batches: list[Any], on_done: Any) -> None:
        self.pending.append((batches, on_done))

    def finish(self, index: int, code: ProduceCode) -> None:
        batches, on_done = self.pending[index]
        on_done([ProduceOutcome(code) for _ in batches])


class SentFrames:
    """The outbox side of the queue: the frames it was given."""

    def __init__(self) -> None:
        self.frames = b""

    def put_urgent(self, frames: bytes) -> None:
        self.frames += frames


def read_publishes(*frames: bytes) -> list[PublishBatch]:
    conn = FiggConnection(Role.SERVER)
    conn.receive_data(b"".join(frames))
    return [e for e in conn.next_batch(0) if isinstance(e, PublishBatch)]


def test_acks_durable_before_a_failed_publish_still_go_out() -> None:
    # Publish 1 (partition 0) is appended before publish 2 (partition 1); 2 fails first,
    # then 1 becomes durable: ACK(1) is sent, nothing after it, and the failure reported.
    backend, sent, failures = HeldBackend(), SentFrames(), []
    acks = AckQueue(sent, failures.append)  # type: ignore[arg-type]
    publishing = Publishing(backend, acks)  # type: ignore[arg-type]
    for frame, topic in ((publish("t", 1, b"a"), "t"), (publish("t/1", 2, b"b"), "t/1")):
        [batch] = read_publishes(frame)
        publishing.add(figg_to_tank(topic), batch)
        publishing.submit()
    backend.finish(1, ProduceCode.IO_FAULT)
    assert sent.frames == b"" and failures == []  # 1 is still being appended
    backend.finish(0, ProduceCode.OK)
    conn = FiggConnection(Role.CLIENT)
    conn.receive_data(sent.frames)
    assert conn.next_events() == [Ack(1)]
    assert len(failures) == 1 and "t/1" in failures[0] and acks.acked == 1
