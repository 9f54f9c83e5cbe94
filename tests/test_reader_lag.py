"""The reader-lag gauges: how far Tank consumers and Figg subscribers are behind."""

from pathlib import Path

import trio

from gateway.client.figg import open_figg_client
from gateway.client.tank import open_tank_client
from gateway.core.config import Settings
from gateway.server.run import ServerInfo, run_server


def gauge(info: ServerInfo, name: str, protocol: str, topic: str) -> float | None:
    prefix = f'{name}{{partition="0",protocol="{protocol}",topic="{topic}"}}'
    for line in info.metrics_registry.render().decode().splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_lag_of_tank_consumers_and_figg_subscribers(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, durability="os", tank_listen="127.0.0.1:0",
                        figg_listen="127.0.0.1:0", metrics_listen="", kafka_listen="",
                        http_listen="")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            info: ServerInfo = await nursery.start(run_server, settings)
            assert info.tank and info.figg
            async with open_tank_client(*info.tank) as tank:
                await tank.produce({("lag", 0): [b"m%d" % i for i in range(50)]})
                # A consumer that asked for sequence 11: 40 messages behind.
                await tank.consume("lag", 0, 11)
                assert gauge(info, "figtank_reader_lag_messages", "tank", "lag") == 40
                async with open_figg_client(*info.figg) as figg:
                    subscription = await figg.subscribe("lag")  # live: at the end
                    await tank.produce({("lag", 0): [b"new"]})
                    message = await subscription.receive()
                    assert message.offset == 51
                    assert gauge(info, "figtank_readers", "figg", "lag") == 1
                    assert gauge(info, "figtank_reader_lag_messages", "figg", "lag") == 0
                # The subscriber left: its reading is no longer reported.
                with trio.fail_after(5):
                    while gauge(info, "figtank_readers", "figg", "lag") is not None:
                        await trio.sleep(0.02)
            info.request_shutdown()
