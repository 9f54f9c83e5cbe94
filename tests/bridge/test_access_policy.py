"""The access policy is the gateway's, whatever the upstream: a bridge enforces it in its
sessions (issue 16: works in bridge mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.client.errors import ProduceFailed, RequestFailed, UnknownTopicError
from gateway.client.tank import open_tank_client
from protocols.figg.messages import Ack, Attached
from tests.auth.helpers import Endpoint, denied
from tests.bridge.helpers import address, bridge_server, upstream_server
from tests.figg.helpers import RawPeer, attach, publish

POLICY = """
[[rule]]
who = ["listener:tank"]
topics = ["payments"]
deny = ["produce", "consume"]
[[rule]]
who = ["listener:tank"]
topics = ["*"]
deny = ["create"]
[[rule]]
who = ["listener:figg"]
topics = ["payments"]
deny = ["subscribe"]
"""


async def test_a_bridge_enforces_the_gateway_policy(tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text(POLICY)
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up") as up:
            async with open_tank_client(*up.tank) as direct:  # the upstream has no policy
                await direct.produce({("payments", 0): [b"p1"], ("orders", 0): [b"o1"]})
            async with bridge_server(address(up.tank), policy_file=policy) as bridge:
                assert bridge.tank is not None and bridge.figg is not None
                async with open_tank_client(*bridge.tank) as client:
                    with pytest.raises(ProduceFailed) as caught:
                        await client.produce({("payments", 0): [b"p2"],
                                              ("orders", 0): [b"o2"]})
                    assert caught.value.errors == {("payments", 0): 0xFE}
                    with pytest.raises(UnknownTopicError):
                        await client.consume("payments", 0, 0)
                    got = await client.consume("orders", 0, 0)
                    assert [m.value for m in got.messages] == [b"o1", b"o2"]
                    with pytest.raises(RequestFailed) as refused:
                        await client.create_topic("fresh", 1)
                    assert refused.value.code == 5
                figg = Endpoint(*bridge.figg)
                peer = await RawPeer.connect(figg)
                await peer.send(attach("orders"), publish("payments", 1, b"p3"))
                got = await peer.receive(2)
                assert Attached("orders", 2) in got and Ack(1) in got
                reader = await RawPeer.connect(figg)
                await reader.send(attach("payments"))
                await reader.expect_closed()
                await peer.aclose()
                assert denied(bridge, "tank", "publish") == 1
                assert denied(bridge, "tank", "create") == 1
                assert denied(bridge, "figg", "subscribe") == 1
            async with open_tank_client(*up.tank) as direct:
                got = await direct.consume("payments", 0, 0)
                assert [m.value for m in got.messages] == [b"p1", b"p3"]
                with pytest.raises(UnknownTopicError):
                    await direct.discover_partitions("fresh")
