"""A changed policy file reloaded on SIGHUP without dropping connections: the next
request on each existing connection is decided by it; a live Figg subscription it no
longer allows ends (its connection closes); a bad file keeps the policy in force
(issue 16: permissions reloaded on SIGHUP)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from gateway.client.errors import ProduceFailed
from gateway.client.tank import open_tank_client
from protocols.figg.messages import Ack, Attached, Data
from tests.auth.helpers import Endpoint, denied, policy_server
from tests.figg.helpers import RawPeer, attach, publish
from tests.serving import ServeProcess, figtank_serve

OPEN = """
[[rule]]
who = "*"
topics = "*"
allow = ["publish", "subscribe", "create"]
"""

NO_NEWS = """
[[rule]]
who = ["listener:figg"]
topics = ["news"]
deny = ["subscribe"]
[[rule]]
who = ["listener:tank"]
topics = ["orders"]
deny = ["produce"]
"""


async def test_reload_applies_to_live_connections_and_ends_revoked_subscriptions(
        tmp_path: Path) -> None:
    with trio.fail_after(15), capture_logs() as logs:
        async with policy_server(tmp_path, OPEN) as (info, settings):
            assert info.figg is not None and info.tank is not None
            figg = Endpoint(*info.figg)
            news = await RawPeer.connect(figg)
            sports = await RawPeer.connect(figg)
            await news.send(attach("news"))
            await sports.send(attach("sports"))
            assert await news.receive_one() == Attached("news", 0)
            assert await sports.receive_one() == Attached("sports", 0)
            async with open_tank_client(*info.tank) as tank:
                await tank.produce({("orders", 0): [b"o1"]})
                assert settings.policy_file is not None
                settings.policy_file.write_text(NO_NEWS)
                assert info.reload()
                await news.expect_closed()  # its subscription is revoked
                with pytest.raises(ProduceFailed) as caught:  # same connection, next request
                    await tank.produce({("orders", 0): [b"o2"]})
                assert caught.value.errors == {("orders", 0): 0xFE}
                publisher = await RawPeer.connect(figg)
                await publisher.send(publish("sports", 1, b"goal"))
                assert await publisher.receive_one() == Ack(1)
                assert await sports.receive_one() == Data("sports", 1, b"goal")
                # A bad file: one reload_failed line, the policy in force stays.
                settings.policy_file.write_text(
                    'default = "deny"\n[[rule]]\nwho = 1\ntopics = "*"\nallow = "publish"\n')
                assert not info.reload()
                with pytest.raises(ProduceFailed):
                    await tank.produce({("orders", 0): [b"o3"]})
                await publisher.send(publish("sports", 2, b"again"))
                assert await publisher.receive_one() == Ack(2)
                assert await sports.receive_one() == Data("sports", 2, b"again")
            assert denied(info, "figg", "subscribe") == 1
            assert denied(info, "tank", "publish") == 2
            for peer in (sports, publisher):
                await peer.aclose()
    failed = [e for e in logs if e["event"] == "reload_failed"]
    assert len(failed) == 1 and "rule[0]: who" in failed[0]["error"]
    assert ("listener:figg", "news", "subscribe", "subscription") in [
        (e["identity"], e["topic"], e["operation"], e["request"]) for e in logs
        if e["event"] == "access_denied"]


async def wait_event(server: ServeProcess, name: str, count: int) -> None:
    with trio.fail_after(10):
        while len(server.events(name)) < count:
            await trio.sleep(0.02)


async def test_sighup_reloads_the_policy_in_a_serve_process(tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text(OPEN)
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--durability", "os",
                       "--tank-listen", "127.0.0.1:0", "--figg-listen", "127.0.0.1:0",
                       "--metrics-listen", "", "--policy-file", str(policy)) as server:
        assert server.figg is not None and server.tank is not None
        figg = Endpoint(*server.figg)
        with trio.fail_after(20):
            subscriber = await RawPeer.connect(figg)
            await subscriber.send(attach("orders"))
            assert await subscriber.receive_one() == Attached("orders", 0)
            async with open_tank_client(*server.tank) as tank:
                await tank.produce({("orders", 0): [b"o1"]})
                assert await subscriber.receive_one() == Data("orders", 1, b"o1")
                policy.write_text(NO_NEWS)
                server.process.send_signal(signal.SIGHUP)
                await wait_event(server, "reloaded", 1)
                with pytest.raises(ProduceFailed) as caught:
                    await tank.produce({("orders", 0): [b"o2"]})
                assert caught.value.errors == {("orders", 0): 0xFE}
                # The subscriber stayed connected and is served: Figg may still publish.
                publisher = await RawPeer.connect(figg)
                await publisher.send(publish("orders", 1, b"o3"))
                assert await publisher.receive_one() == Ack(1)
                assert await subscriber.receive_one() == Data("orders", 2, b"o3")
                # A bad file on reload: the policy in force stays.
                policy.write_text("default = \"sometimes\"\n")
                server.process.send_signal(signal.SIGHUP)
                await wait_event(server, "reload_failed", 1)
                with pytest.raises(ProduceFailed):
                    await tank.produce({("orders", 0): [b"o4"]})
                await publisher.send(publish("orders", 2, b"o5"))
                assert await publisher.receive_one() == Ack(2)
                assert await subscriber.receive_one() == Data("orders", 3, b"o5")
            await subscriber.aclose()
            await publisher.aclose()
        assert server.stop() == 0
    [failed] = server.events("reload_failed")
    assert failed["error"].endswith("default: expected \"allow\" or \"deny\", got 'sometimes'")
    assert failed["action"] == "kept the one in force"


def test_a_bad_policy_file_at_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text('[[rule]]\nwho = "*"\ntopics = "*"\nallow = ["fly"]\n')
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--tank-listen", "127.0.0.1:0",
         "--figg-listen", "127.0.0.1:0", "--metrics-listen", "", "--kafka-listen", "",
         "--http-listen", "",
         "--policy-file", str(policy)], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line == (f"figtank: configuration error: auth.policy_file: {policy}: rule[0]: "
                    "allow: unknown operation 'fly' (expected publish, produce, subscribe, "
                    "consume, create, configure, admin, discover)")
    assert not (tmp_path / "data").exists()  # nothing was started
