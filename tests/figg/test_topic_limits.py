"""Figg ATTACH and PUBLISH create topics only within ``limits.max_topics`` (issue 15,
item 7): past it the connection is closed with a log line naming the limit, and the
server serves everyone else."""

from __future__ import annotations

from pathlib import Path

import trio
from structlog.testing import capture_logs

from gateway.core.config import Settings
from protocols.figg.messages import Ack, Attached
from tests.figg.helpers import RawPeer, attach, publish
from tests.listeners import listening


def closing_reasons(logs: list[dict]) -> list[str]:
    return [str(e.get("reason")) for e in logs if e["event"] == "connection_closed"]


async def test_attach_and_publish_past_max_topics_close_the_connection(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", durability="os", max_topics=2)
    with trio.fail_after(10), capture_logs() as logs:
        async with listening("figg", None, settings) as server:
            peer = await RawPeer.connect(server)
            await peer.send(attach("one"), publish("two", 1, b"x"))
            got = await peer.receive(2)
            assert Attached("one", 0) in got and Ack(1) in got
            attacher = await RawPeer.connect(server)
            await attacher.send(attach("three"))
            await attacher.expect_closed()
            publisher = await RawPeer.connect(server)
            await publisher.send(publish("four", 1, b"y"))
            await publisher.expect_closed()
            await peer.send(publish("one", 2, b"z"))  # the first connection is served on
            assert await peer.receive_one() == Ack(2)
            assert server.metric('figtank_limit_hits_total{limit="max_topics"}') == 2
            assert sorted(server.backend.store.topics()) == ["one", "two"]
            await peer.aclose()
    reasons = closing_reasons(logs)
    assert sum("limits.max_topics=2" in r for r in reasons) == 2, reasons
    assert [e["limit"] for e in logs if e["event"] == "topic_limit_reached"] == [
        "max_topics", "max_topics"]
