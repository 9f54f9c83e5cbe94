"""``figtank serve`` as a real process: config file, signals, metrics, restart on its data."""

import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio

from gateway.cli.main import serving_line
from gateway.client.figg import open_figg_client
from gateway.core.config import Settings
from gateway.server.run import open_server
from tests.serving import figtank_serve


def write_config(tmp_path: Path, **extra: str) -> Path:
    config = tmp_path / "figtank.toml"
    lines = [
        "[store]", f'data_dir = "{tmp_path / "data"}"', 'durability = "fsync"',
        "[listen]", 'tank = "127.0.0.1:0"', 'figg = "127.0.0.1:0"', 'metrics = "127.0.0.1:0"',
    ]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    config.write_text("\n".join(lines) + "\n")
    return config


def http_get(address: tuple[str, int], path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def publish(address: tuple[str, int], topic: str, values: list[bytes]) -> None:
    async with open_figg_client(*address) as client:
        for value in values:
            await client.publish(topic, value)
        await client.wait_all_acked()


async def read_back(address: tuple[str, int], topic: str, count: int) -> list[tuple[int, bytes]]:
    async with open_figg_client(*address) as client:
        subscription = await client.subscribe(topic, from_offset=0)
        got = []
        with trio.fail_after(10):
            async for message in subscription:
                got.append((message.offset, message.data))
                if len(got) == count:
                    break
        return got


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[store]\ndurability = "whenever"\n')
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "figtank: configuration error: store.durability: expected one of fsync, os "
        "(got 'whenever')"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_serve_signal_restart_and_metrics(tmp_path: Path, sig: int) -> None:
    config = write_config(tmp_path)
    values = [f"message {i}".encode() for i in range(20)]
    with figtank_serve("--config", str(config), "--grace", "0.2") as server:
        assert server.figg and server.tank and server.metrics
        status, body = http_get(server.metrics, "/health")
        assert (status, body) == (200, "ready\n")
        await publish(server.figg, "orders", values)
        status, text = http_get(server.metrics, "/metrics")
        assert status == 200
        assert 'figtank_messages_in_total{topic="orders"} 20.0' in text
        assert 'figtank_connections_accepted_total{listener="figg",protocol="figg"}' in text
        assert server.stop(sig) == 0
        assert server.events("figtank_stopped")
    # The acknowledged messages are all there after a restart on the same store.
    with figtank_serve("--config", str(config)) as server:
        # A new topic's sequence numbers, the Figg offsets, start at 1.
        assert await read_back(server.figg, "orders", 20) == list(
            zip(range(1, 21), values, strict=True))
        assert server.stop() == 0


async def test_the_serving_line_names_every_listener_in_order(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", durability="os", **{
        f"{name}_listen": "127.0.0.1:0" for name in ("tank", "figg", "kafka", "metrics",
                                                      "http")})
    async with open_server(settings, grace=0.2) as server:
        line = serving_line(server)
    figg, tank, kafka, metrics, http = (server.addresses[n] for n in (
        "figg", "tank", "kafka", "metrics", "http"))
    assert line == (f"figtank: serving Figg on 127.0.0.1:{figg[1]}, Tank on "
                    f"127.0.0.1:{tank[1]}, Kafka on 127.0.0.1:{kafka[1]}, HTTP on "
                    f"http://127.0.0.1:{http[1]}/, metrics on "
                    f"http://127.0.0.1:{metrics[1]}/metrics (Ctrl-C stops)")
