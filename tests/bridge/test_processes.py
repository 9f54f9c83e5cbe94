"""``figtank serve`` in bridge mode as real processes: the config file, and an upstream
restart in the middle of publishing and subscribing."""

from __future__ import annotations

from pathlib import Path

import trio

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from tests.bridge.helpers import free_port, metric
from tests.serving import Served

OFF = ""
LOOPBACK = "127.0.0.1:0"


def upstream_args(data_dir: Path, port: int) -> tuple[str, ...]:
    return ("--data-dir", str(data_dir), "--durability", "fsync",
            "--tank-listen", f"127.0.0.1:{port}", "--figg-listen", OFF,
            "--metrics-listen", OFF, "--grace", "0.2")


async def test_config_file_selects_bridge_mode(tmp_path: Path) -> None:
    up_port, dead_port = free_port(), free_port()
    config = tmp_path / "bridge.toml"
    config.write_text("\n".join([
        "[listen]", f'tank = "{LOOPBACK}"', f'figg = "{LOOPBACK}"', f'metrics = "{LOOPBACK}"',
        "[upstream]", f'brokers = ["127.0.0.1:{dead_port}", "127.0.0.1:{up_port}"]', ""]))
    upstream = Served(*upstream_args(tmp_path / "up", up_port))
    bridge = Served("--config", str(config), "--grace", "0.2")
    try:
        with trio.fail_after(30):
            await upstream.start()
            served = await bridge.start()
            assert served.figg and served.metrics
            serving = served.events("figtank_serving")[-1]
            assert serving["backend"] == "upstream"
            assert serving["upstream"] == [f"127.0.0.1:{dead_port}", f"127.0.0.1:{up_port}"]
            async with open_figg_client(*served.figg) as figg:
                await figg.publish_and_wait("configured", b"through the bridge")
            async with open_tank_client("127.0.0.1", up_port, request_timeout=5) as tank:
                result = await tank.consume("configured", 0, 1)
            assert [(m.seq, m.value) for m in result.messages] == [(1, b"through the bridge")]
            assert metric(served.metrics, "figtank_upstream_up") == 1
            assert not (tmp_path / "data").exists()  # no log of its own
    finally:
        bridge.close()
        upstream.close()


async def test_upstream_restart_mid_publish_and_subscribe(tmp_path: Path) -> None:
    port = free_port()
    count = 600
    values = [b"m%05d" % i for i in range(count)]
    upstream = Served(*upstream_args(tmp_path / "up", port))
    # A restarted upstream can take several seconds to listen again on a busy machine:
    # publishes wait for it up to upstream.wait_secs, here beyond the test's own bound.
    config = tmp_path / "bridge.toml"
    config.write_text("[upstream]\nwait_secs = 40.0\n")
    bridge = Served("--upstream", f"127.0.0.1:{port}", "--tank-listen", LOOPBACK,
                    "--figg-listen", LOOPBACK, "--metrics-listen", LOOPBACK, "--grace", "0.2",
                    "--config", str(config))
    acked: set[bytes] = set()
    received: list[tuple[int, bytes]] = []
    try:
        with trio.fail_after(45):
            await upstream.start()
            served = await bridge.start()
            assert served.figg and served.metrics
            async with open_figg_client(*served.figg) as publisher, \
                    open_figg_client(*served.figg) as subscriber:
                sub = await subscriber.subscribe("stream", from_offset=0)
                enough = trio.Event()

                async def publish() -> None:
                    for i, value in enumerate(values):
                        await publisher.publish("stream", value,
                                                lambda _, v=value: acked.add(v))
                        if i == count // 3:
                            enough.set()
                        await trio.sleep(0.003)
                    await publisher.wait_all_acked()

                async def read() -> None:
                    async for message in sub:
                        received.append((message.offset, message.data))
                        if len(received) >= count and set(values) <= {d for _, d in received}:
                            return

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(publish)
                    nursery.start_soon(read)
                    await enough.wait()
                    await upstream.kill()
                    acked_before_restart = set(acked)
                    await trio.sleep(0.3)
                    await upstream.start()
                assert publisher.connections == 1
                assert subscriber.connections == 1

            async with open_tank_client("127.0.0.1", port, request_timeout=5) as tank:
                bounds = await tank.discover_partitions("stream")
                log = (await tank.consume("stream", 0, 1, fetch_size=64 * 1024 * 1024))
            stored = [(m.seq, m.value) for m in log.messages]
            hwm = bounds[0].high_water_mark
            assert [seq for seq, _ in stored] == list(range(1, hwm + 1))
            # No acknowledged publish lost, before or after the restart.
            assert acked_before_restart <= {v for _, v in stored}
            assert set(values) == acked <= {v for _, v in stored}
            # The subscriber saw the log as stored: no gap, no reordering.
            assert received == stored[:len(received)]
            assert metric(served.metrics, "figtank_upstream_outages_total") == 1
            assert metric(served.metrics, "figtank_upstream_up") == 1
            events = [e["event"] for e in served.log_lines
                      if e.get("event") in ("upstream_down", "upstream_up")]
            assert events == ["upstream_up", "upstream_down", "upstream_up"]
    finally:
        bridge.close()
        upstream.close()
