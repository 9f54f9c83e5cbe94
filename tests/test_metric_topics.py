"""Per-topic series are bounded by ``limits.metric_topics`` (issue 15, item 4): the first
topics keep their own series, the others are summed under ``topic="_other"`` in counters
(appends, deliveries) and in collectors (partition sizes, reader lag)."""

from __future__ import annotations

import re
from pathlib import Path

import trio
from structlog.testing import capture_logs

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from gateway.core.config import Settings
from gateway.server.run import open_server
from tests.test_http_endpoint import Peer, get

_SAMPLE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')


def samples(text: str, name: str) -> dict[str, float]:
    """``name``'s samples: the label text (``partition="0",topic="a"``) -> value."""
    found = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match[1] == name:
            found[match[2]] = float(match[3])
    return found


async def test_topics_over_the_limit_are_summed_under_other(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, durability="os", figg_listen="127.0.0.1:0",
                        tank_listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", kafka_listen="",
                        http_listen="",
                        metric_topics=2)
    with trio.fail_after(15), capture_logs() as logs:
        async with open_server(settings, grace=0) as server:
            assert server.figg and server.tank and server.metrics
            async with open_figg_client(*server.figg) as figg:
                for topic, count in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
                    for i in range(count):
                        await figg.publish_and_wait(topic, b"%s-%d" % (topic.encode(), i))
                sub = await figg.subscribe("d", from_offset=0)
                for _ in range(4):
                    await sub.receive()
                async with open_tank_client(*server.tank) as tank:
                    assert len((await tank.consume("c", 0, 1)).messages) == 3
                    peer = await Peer.connect(server.metrics)
                    await peer.send(get("/metrics"))
                    status, _, body = await peer.response()
    assert status == 200
    text = body.decode()
    assert samples(text, "figtank_messages_in_total") == {
        'topic="a"': 1, 'topic="b"': 2, 'topic="_other"': 3 + 4}
    # Deliveries of c (Tank) and d (Figg): under _other too.
    assert samples(text, "figtank_messages_out_total") == {'topic="_other"': 4}
    assert set(samples(text, "figtank_bytes_out_total")) == {'topic="_other"'}
    # Collectors fold at scrape time: sizes summed, the largest lag, readers counted.
    sizes = samples(text, "figtank_partition_bytes")
    assert set(sizes) == {'partition="0",topic="a"', 'partition="0",topic="b"',
                          'partition="_other",topic="_other"'}
    assert sizes['partition="_other",topic="_other"'] > sizes['partition="0",topic="b"'] > 0
    assert samples(text, "figtank_readers") == {
        'partition="_other",protocol="figg",topic="_other"': 1,
        'partition="_other",protocol="tank",topic="_other"': 1}
    assert set(samples(text, "figtank_reader_lag_messages")) == {
        'partition="_other",protocol="figg",topic="_other"',
        'partition="_other",protocol="tank",topic="_other"'}
    # The limit counts each topic folded, and logs the first time only.
    assert samples(text, "figtank_limit_hits_total") == {'limit="metric_topics"': 2}
    reached = [e for e in logs if e["event"] == "metric_topics_limit_reached"]
    assert len(reached) == 1 and reached[0]["limit"] == 2 and reached[0]["topic"] == "c"
