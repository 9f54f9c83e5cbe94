"""Each request's handler sees its own request's client id, even when requests of other
client ids were read before the handler's task ran (one read holding several)."""

from __future__ import annotations

import struct
from typing import Any

import trio

from protocols.kafka.messages import REQUESTS, request_header_version
from protocols.kafka.records import (
    DescribeGroupsRequest,
    MetadataRequest,
    RequestHeader,
    encode_request_header,
)
from protocols.kafka.types import ApiKey
from tests.kafka.raw import call
from tests.kafka.test_groups import connect, join_body, server_for


def _frame(api_key: int, version: int, correlation_id: int, client_id: str, body: Any
           ) -> bytes:
    header = encode_request_header(RequestHeader(api_key, version, correlation_id, client_id),
                                   request_header_version(api_key, version))
    payload = header + REQUESTS[api_key].encode(body, version=version)
    return struct.pack(">i", len(payload)) + payload


async def _frames(stream: trio.SocketStream, count: int) -> None:
    """Read ``count`` response frames (their contents do not matter here)."""
    buf = b""
    while count:
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
            buf = buf[4 + struct.unpack_from(">i", buf)[0]:]
            count -= 1
            continue
        data = await stream.receive_some(65536)
        assert data, "the connection closed"
        buf += data


async def test_a_join_keeps_its_own_client_id(tmp_path):
    async with server_for(tmp_path) as server:
        with trio.fail_after(10):
            s = await connect(server)
            # One send: the static join (answered at once), then a Metadata of another id.
            await s.send_all(_frame(ApiKey.JOIN_GROUP, 5, 1, "joiner", join_body(
                instance="i-1")) + _frame(ApiKey.METADATA, 9, 2, "other", MetadataRequest(
                    topics=[])))
            await _frames(s, 2)
            described = (await call(s, ApiKey.DESCRIBE_GROUPS, 5, DescribeGroupsRequest(
                groups=["g"], include_authorized_operations=False), 3))[1].groups
    assert [m.client_id for m in described[0].members] == ["joiner"]
