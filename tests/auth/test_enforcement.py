"""The access policy enforced on real loopback connections, Tank and Figg, with each
protocol's own refusals (issue 16: permissions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from gateway.client.errors import (
    ConnectionLost,
    ProduceFailed,
    RequestFailed,
    UnknownTopicError,
)
from gateway.client.tank import open_tank_client
from protocols.figg.messages import Ack, Attached
from tests.auth.helpers import acting_as, denied, policy_server
from tests.figg.helpers import RawPeer, attach, publish

ALICE = "CN=alice,O=acme"

ALICE_POLICY = """
default = "deny"
[[rule]]
who = ["CN=alice,O=acme"]
topics = ["orders-*"]
allow = ["publish", "subscribe", "create"]
[[rule]]
who = ["CN=alice,O=acme"]
topics = ["payments"]
allow = ["publish"]
[[rule]]
who = ["listener:tank"]
topics = ["*"]
allow = ["publish", "subscribe", "create"]
"""

READ_ONLY_POLICY = """
[[rule]]
who = ["listener:analytics"]
topics = ["*"]
allow = ["consume"]
deny = ["produce", "create", "configure"]
"""


def access_denied(logs: list[dict]) -> list[tuple[str, str | None, str]]:
    return [(e["identity"], e["topic"], e["operation"]) for e in logs
            if e["event"] == "access_denied"]


async def test_identity_may_publish_to_orders_but_not_read_payments_on_tank(
        tmp_path: Path) -> None:
    with trio.fail_after(15), capture_logs() as logs:
        async with policy_server(tmp_path, ALICE_POLICY) as (info, settings), \
                acting_as(info, settings, "tank", name="tank-mtls", identity=ALICE) as alice:
            assert info.tank is not None
            async with open_tank_client(*info.tank) as admin:  # listener:tank may do all
                await admin.produce({("payments", 0): [b"salary"]})
            async with open_tank_client(alice.host, alice.port) as client:
                await client.produce({("orders-eu", 0): [b"o1", b"o2"]})
                got = await client.consume("orders-eu", 0, 0)
                assert [m.value for m in got.messages] == [b"o1", b"o2"]
                await client.produce({("payments", 0): [b"p"]})  # publish is allowed
                with pytest.raises(UnknownTopicError):  # reading it is not: no such topic
                    await client.consume("payments", 0, 0)
                with pytest.raises(ProduceFailed) as caught:  # nor writing elsewhere
                    await client.produce({("audit", 0): [b"a"], ("orders-eu", 0): [b"o3"]})
                assert caught.value.errors == {("audit", 0): 0xFE}
                # the one refused topic did not stop the other
                got = await client.consume("orders-eu", 0, 3)
                assert [m.value for m in got.messages] == [b"o3"]
                # discovery shows only what alice may do something with
                names = {t.name for t in await client.discover_topics()}
                assert names == {"orders-eu", "payments"}
            assert denied(info, "tank-mtls", "subscribe") == 1
            assert denied(info, "tank-mtls", "publish") == 1
    assert access_denied(logs) == [(ALICE, "payments", "subscribe"),
                                   (ALICE, "audit", "publish")]


async def test_identity_may_publish_to_orders_but_not_read_payments_on_figg(
        tmp_path: Path) -> None:
    with trio.fail_after(15), capture_logs() as logs:
        async with policy_server(tmp_path, ALICE_POLICY) as (info, settings), \
                acting_as(info, settings, "figg", name="figg-mtls", identity=ALICE) as alice:
            peer = await RawPeer.connect(alice)
            await peer.send(attach("orders-eu"), publish("orders-eu", 1, b"o1"))
            got = await peer.receive(2)
            assert Attached("orders-eu", 0) in got and Ack(1) in got
            reader = await RawPeer.connect(alice)
            await reader.send(attach("payments"))
            await reader.expect_closed()
            writer = await RawPeer.connect(alice)
            await writer.send(publish("audit", 1, b"a"))
            await writer.expect_closed()
            await peer.send(publish("orders-eu", 2, b"o2"))  # alice's first connection goes on
            assert (await peer.receive(2))[-1] == Ack(2)
            await peer.aclose()
            assert denied(info, "figg-mtls", "subscribe") == 1
            assert denied(info, "figg-mtls", "publish") == 1
            assert info.backend is not None
            assert await info.backend.discover_partitions("audit") is None
    assert access_denied(logs) == [(ALICE, "payments", "subscribe"),
                                   (ALICE, "audit", "publish")]
    reasons = [str(e.get("reason")) for e in logs if e["event"] == "connection_closed"]
    assert any("CN=alice,O=acme may not subscribe 'payments'" in r for r in reasons), reasons


async def test_read_only_listener_refuses_produce_and_create_while_consume_works(
        tmp_path: Path) -> None:
    with trio.fail_after(15), capture_logs() as logs:
        async with policy_server(tmp_path, READ_ONLY_POLICY) as (info, settings), \
                acting_as(info, settings, "tank", name="analytics") as analytics:
            assert info.tank is not None
            async with open_tank_client(*info.tank) as writer:
                await writer.produce({("events", 0): [b"e1"]})
            async with open_tank_client(analytics.host, analytics.port) as client:
                with pytest.raises(ProduceFailed) as caught:
                    await client.produce({("events", 0): [b"nope"]})
                assert caught.value.errors == {("events", 0): 0xFE}
                with pytest.raises(RequestFailed) as refused:
                    await client.create_topic("fresh", 1)
                assert refused.value.code == 5
                with pytest.raises(UnknownTopicError):  # ReloadConf: 11
                    await client.reload_conf("events", 0)
                got = await client.consume("events", 0, 0)
                assert [m.value for m in got.messages] == [b"e1"]
                assert (await client.status()).topics == 1  # admin: default allow
            assert info.backend is not None
            assert await info.backend.discover_partitions("fresh") is None
            assert denied(info, "analytics", "publish") == 1
            assert denied(info, "analytics", "create") == 1
            assert denied(info, "analytics", "configure") == 1
    assert [(e["operation"], e["outcome"]) for e in logs if e["event"] == "access_denied"] == [
        ("publish", "read-only (0xfe)"), ("create", "read-only (5)"),
        ("configure", "unknown topic (11)")]


async def test_deny_by_default(tmp_path: Path) -> None:
    with trio.fail_after(15):
        async with policy_server(tmp_path, 'default = "deny"\n') as (info, _):
            assert info.tank is not None and info.figg is not None and info.backend
            await info.backend.create_topic("t", 1)
            async with open_tank_client(*info.tank) as client:
                with pytest.raises(ProduceFailed) as caught:
                    await client.produce({("t", 0): [b"x"]})
                assert caught.value.errors == {("t", 0): 0xFE}
                with pytest.raises(UnknownTopicError):
                    await client.consume("t", 0, 0)
                with pytest.raises(UnknownTopicError):
                    await client.discover_partitions("t")
                assert await client.discover_topics() == []
            async with open_tank_client(*info.tank) as client:
                with pytest.raises(ConnectionLost):  # Status refused: closed
                    await client.status()
            peer = await RawPeer.connect(_figg(info))
            await peer.send(publish("t", 1, b"x"))
            await peer.expect_closed()


async def test_produce_to_a_missing_topic_needs_create(tmp_path: Path) -> None:
    policy = """
    [[rule]]
    who = "*"
    topics = ["made-*"]
    allow = ["create"]
    [[rule]]
    who = "*"
    topics = "*"
    deny = ["create"]
    """
    with trio.fail_after(15):
        async with policy_server(tmp_path, policy) as (info, _):
            assert info.tank is not None and info.backend is not None
            await info.backend.create_topic("there", 1)
            async with open_tank_client(*info.tank) as client:
                with pytest.raises(ProduceFailed) as caught:
                    await client.produce({("missing", 0): [b"x"], ("there", 0): [b"y"]})
                assert caught.value.errors == {("missing", 0): 0xFF}
                await client.produce({("made-1", 0): [b"z"]})  # may create: created
                got = await client.consume("there", 0, 0)
                assert [m.value for m in got.messages] == [b"y"]
            assert await info.backend.discover_partitions("missing") is None
            assert await info.backend.discover_partitions("made-1") is not None
            peer = await RawPeer.connect(_figg(info))
            await peer.send(publish("there", 1, b"ok"))
            assert await peer.receive_one() == Ack(1)
            await peer.send(attach("missing2"))  # no create: not created, closed
            await peer.expect_closed()
            assert await info.backend.discover_partitions("missing2") is None
            assert denied(info, "tank", "create") == 1
            assert denied(info, "figg", "create") == 1


def _figg(info: object) -> object:
    from tests.auth.helpers import Endpoint
    figg = info.figg  # type: ignore[attr-defined]
    assert figg is not None
    return Endpoint(*figg)
