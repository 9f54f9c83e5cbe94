"""Consumer groups in the access policy on the Kafka listener: raw requests of every group
API answered GROUP_AUTHORIZATION_FAILED without the permission (counted and logged), a
SIGHUP-style reload applied to an open connection, and real clients (confluent-kafka,
kafka-python) failing to join a group they may not use with a clear error while joining
one they may."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import kafka.errors
import trio
from structlog.testing import capture_logs

from gateway.core.config import ListenerTable
from gateway.server.run import ServerInfo
from protocols.kafka import records as r
from protocols.kafka.types import ApiKey, ErrorCode
from tests.auth.helpers import denied
from tests.kafka.helpers import CONFLUENT, bootstrap, kafka_server
from tests.kafka.raw import call
from tests.kafka.test_commits import _commit_body
from tests.kafka.test_groups import FAST, heartbeat, join, sync
from tests.kafka.test_real_clients import produce

DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
POLICY = """
default = "deny"

[[rule]]
who = ["*"]
topics = ["*"]
allow = ["publish", "subscribe", "create"]

[[rule]]
who = ["listener:kafka"]
groups = ["team-*"]
allow = ["subscribe"]

[[rule]]
who = ["listener:viewer"]
groups = ["*"]
allow = ["discover"]
"""


def _server(tmp_path: Path, policy: str = POLICY) -> Any:
    path = tmp_path / "access.toml"
    path.write_text(policy)
    return kafka_server(tmp_path, policy_file=path, **FAST, listeners={
        "viewer": ListenerTable(protocol="kafka", address="127.0.0.1:0", tls=False)})


async def _connect(server: ServerInfo, name: str = "kafka") -> trio.SocketStream:
    host, port = server.addresses[name][:2]
    return await trio.open_tcp_stream(host, port)


async def test_every_group_api_needs_the_group_permission_raw(tmp_path):
    with capture_logs() as logs:
        async with _server(tmp_path) as server:
            await server.backend.create_topic("t", 1)
            with trio.fail_after(20):
                s = await _connect(server)
                v = await _connect(server, "viewer")
                find = (await call(s, ApiKey.FIND_COORDINATOR, 3,
                                   r.FindCoordinatorRequest(key="other")))[1]
                finds = (await call(s, ApiKey.FIND_COORDINATOR, 4, r.FindCoordinatorRequest(
                    coordinator_keys=["other", "team-a"])))[1]
                joined = await join(s, group="other", member="m-1")
                synced = await sync(s, "m-1", 1, group="other")
                beat = await heartbeat(s, "m-1", 1, group="other")
                left0 = (await call(s, ApiKey.LEAVE_GROUP, 0, r.LeaveGroupRequest(
                    group_id="other", member_id="m-1")))[1]
                left3 = (await call(s, ApiKey.LEAVE_GROUP, 3, r.LeaveGroupRequest(
                    group_id="other", members=[r.MemberIdentity(member_id="m-1")])))[1]
                commit = (await call(s, ApiKey.OFFSET_COMMIT, 7, _commit_body(
                    "other", [("t", 0, 1, None)])))[1]
                allowed = (await call(s, ApiKey.OFFSET_COMMIT, 7, _commit_body(
                    "team-a", [("t", 0, 1, None)])))[1]
                # The viewer may discover (read offsets, describe, list) but not commit.
                viewer_commit = (await call(v, ApiKey.OFFSET_COMMIT, 7, _commit_body(
                    "team-a", [("t", 0, 2, None)])))[1]
                fetch1 = (await call(s, ApiKey.OFFSET_FETCH, 1, r.OffsetFetchRequest(
                    group_id="other", topics=[r.OffsetFetchRequestTopic("t", [0])])))[1]
                fetch5 = (await call(s, ApiKey.OFFSET_FETCH, 5, r.OffsetFetchRequest(
                    group_id="other", topics=None)))[1]
                fetch8 = (await call(s, ApiKey.OFFSET_FETCH, 8, r.OffsetFetchRequest(groups=[
                    r.OffsetFetchRequestGroup("other", topics=None),
                    r.OffsetFetchRequestGroup("team-a", topics=None)])))[1]
                viewer_fetch = (await call(v, ApiKey.OFFSET_FETCH, 5, r.OffsetFetchRequest(
                    group_id="team-a", topics=None)))[1]
                delete = (await call(s, ApiKey.OFFSET_DELETE, 0, r.OffsetDeleteRequest(
                    "other", [r.OffsetDeleteRequestTopic(
                        "t", [r.OffsetDeleteRequestPartition(0)])])))[1]
                described = (await call(s, ApiKey.DESCRIBE_GROUPS, 5, r.DescribeGroupsRequest(
                    groups=["other", "team-a"])))[1]
                listed = (await call(s, ApiKey.LIST_GROUPS, 4, r.ListGroupsRequest()))[1]
                # "other" exists (the viewer sees it once it has offsets): commit from a
                # principal allowed everything is not available here, so use the store.
                await server.offsets.commit("other", [("t", 0, 5, None)])
                viewer_list = (await call(v, ApiKey.LIST_GROUPS, 4, r.ListGroupsRequest()))[1]
                listed_again = (await call(s, ApiKey.LIST_GROUPS, 4, r.ListGroupsRequest()))[1]
            subscribe_denials = denied(server, "kafka", "group_subscribe")
            discover_denials = denied(server, "kafka", "group_discover")
    assert find.error_code == DENIED and find.node_id == -1
    assert [(c.key, c.error_code) for c in finds.coordinators] == [
        ("other", DENIED), ("team-a", 0)]
    assert (joined.error_code, joined.member_id) == (DENIED, "m-1")
    assert (synced.error_code, beat, left0.error_code, left3.error_code) == (DENIED,) * 4
    assert [p.error_code for t in commit.topics for p in t.partitions] == [DENIED]
    assert [p.error_code for t in allowed.topics for p in t.partitions] == [0]
    assert [p.error_code for t in viewer_commit.topics for p in t.partitions] == [DENIED]
    assert [(p.committed_offset, p.error_code)
            for t in fetch1.topics for p in t.partitions] == [(-1, DENIED)]
    assert (fetch5.error_code, fetch5.topics) == (DENIED, [])
    assert [(g.group_id, g.error_code) for g in fetch8.groups] == [
        ("other", DENIED), ("team-a", 0)]
    assert [p.committed_offset for g in fetch8.groups[1:] for t in g.topics
            for p in t.partitions] == [1]
    assert viewer_fetch.error_code == 0
    assert [p.committed_offset for t in viewer_fetch.topics for p in t.partitions] == [1]
    assert delete.error_code == DENIED
    assert [(g.group_id, g.error_code) for g in described.groups] == [
        ("other", DENIED), ("team-a", 0)]
    assert [g.group_id for g in listed.groups] == ["team-a"]
    assert sorted(g.group_id for g in viewer_list.groups) == ["other", "team-a"]
    assert [g.group_id for g in listed_again.groups] == ["team-a"]  # filtered, not refused
    assert subscribe_denials >= 6 and discover_denials >= 4
    lines = [e for e in logs if e["event"] == "access_denied" and e.get("group")]
    # One line per group and operation on a connection (as for topics).
    assert sorted((e["group"], e["operation"], e["request"]) for e in lines) == [
        ("other", "group_discover", "find_coordinator"),
        ("other", "group_subscribe", "join_group"),
        ("team-a", "group_subscribe", "offset_commit")]
    assert all(e["outcome"] == "group_authorization_failed" for e in lines)


async def test_a_reload_applies_group_rules_to_open_connections(tmp_path):
    async with _server(tmp_path) as server:
        with trio.fail_after(10):
            s = await _connect(server)
            before = (await call(s, ApiKey.FIND_COORDINATOR, 3,
                                 r.FindCoordinatorRequest(key="other")))[1]
            (tmp_path / "access.toml").write_text(POLICY.replace('"team-*"', '"*"'))
            assert server.reload()  # what SIGHUP calls
            after = (await call(s, ApiKey.FIND_COORDINATOR, 3,
                                r.FindCoordinatorRequest(key="other")))[1]
            # Back to a file naming no groups: every group is open again.
            (tmp_path / "access.toml").write_text(
                POLICY.split("[[rule]]\nwho = [\"listener:kafka\"]")[0])
            with capture_logs() as logs:
                assert server.reload()
            third = (await call(s, ApiKey.DESCRIBE_GROUPS, 5,
                                r.DescribeGroupsRequest(groups=["anything"])))[1]
    assert (before.error_code, after.error_code) == (DENIED, 0)
    assert third.groups[0].error_code == 0
    assert [e["event"] for e in logs if e["event"] == "access_policy_groups_open"]


async def test_real_clients_without_the_group_permission_fail_to_join(tmp_path):
    def confluent(addr: str, group: str) -> Any:
        consumer = ck.Consumer({**CONFLUENT, "bootstrap.servers": addr, "group.id": group,
                                "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe(["t"])
            for _ in range(40):
                message = consumer.poll(0.25)
                if message is not None:
                    return message.error().code() if message.error() else message.value()
            return None
        finally:
            consumer.close()

    def kafka_python(addr: str, group: str) -> Any:
        consumer = kafka.KafkaConsumer("t", bootstrap_servers=addr, group_id=group,
                                       auto_offset_reset="earliest", request_timeout_ms=5000,
                                       session_timeout_ms=6000, heartbeat_interval_ms=1000)
        try:
            for _ in range(40):
                for records in consumer.poll(250).values():
                    return records[0].value
            return None
        except kafka.errors.GroupAuthorizationFailedError as exc:
            return type(exc).__name__
        finally:
            consumer.close()

    async with _server(tmp_path) as server:
        addr = bootstrap(server)
        with trio.fail_after(60):
            await trio.to_thread.run_sync(lambda: produce(addr, "t", [(None, b"hello")]))
            refused = await trio.to_thread.run_sync(confluent, addr, "other")
            joined = await trio.to_thread.run_sync(confluent, addr, "team-a")
            kp_refused = await trio.to_thread.run_sync(kafka_python, addr, "other")
            kp_joined = await trio.to_thread.run_sync(kafka_python, addr, "team-b")
    assert refused == ck.KafkaError.GROUP_AUTHORIZATION_FAILED
    assert joined == b"hello"
    assert kp_refused == "GroupAuthorizationFailedError"
    assert kp_joined == b"hello"
