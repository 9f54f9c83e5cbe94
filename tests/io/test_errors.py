"""The exception maps at the socket edges, on real loopback connections."""

from __future__ import annotations

import pytest
import trio

from gateway.client.errors import ConnectionLost
from gateway.io.errors import ExceptionMap, socket_errors
from gateway.io.limits import RECEIVE_SIZE
from gateway.serving.session import PROTOCOL_ERRORS, RECEIVE_ERRORS, CloseConnection
from protocols.errors import FrameTooLarge, ProtocolError
from tests.io.helpers import reset, tcp_pair


class EdgeError(Exception):
    pass


EDGE = socket_errors("receive", EdgeError)


async def test_a_reset_connection_becomes_the_edges_exception_with_one_reason() -> None:
    async with tcp_pair() as (sender, receiver):
        reset(sender)
        with pytest.raises(EdgeError) as caught, EDGE:
            await receiver.receive_some(RECEIVE_SIZE)
    assert str(caught.value).startswith("receive failed: BrokenResourceError(")
    assert isinstance(caught.value.__cause__, trio.BrokenResourceError)


async def test_a_closed_stream_and_a_raw_oserror_are_mapped_too() -> None:
    async with tcp_pair() as (_sender, receiver):
        await receiver.aclose()
        with pytest.raises(EdgeError, match=r"^receive failed: ClosedResourceError"), EDGE:
            await receiver.receive_some(RECEIVE_SIZE)
    with pytest.raises(EdgeError, match=r"^receive failed: ConnectionResetError"), EDGE:
        raise ConnectionResetError(104, "Connection reset by peer")


async def test_the_server_edge_closes_the_connection_as_reset() -> None:
    async with tcp_pair() as (sender, receiver):
        reset(sender)
        with pytest.raises(CloseConnection) as caught, RECEIVE_ERRORS:
            await receiver.receive_some(RECEIVE_SIZE)
    assert caught.value.kind == "reset"
    assert caught.value.reason.startswith("receive failed: ")


def test_protocol_violations_close_by_kind() -> None:
    with pytest.raises(CloseConnection) as caught, PROTOCOL_ERRORS:
        raise FrameTooLarge("frame payload of 9 bytes exceeds the maximum of 8")
    assert (caught.value.kind, caught.value.reason) == (
        "frame_too_large", "frame payload of 9 bytes exceeds the maximum of 8")
    with pytest.raises(CloseConnection) as caught, PROTOCOL_ERRORS:
        raise ProtocolError("bad")
    assert caught.value.kind == "protocol_error"


def test_rules_apply_in_order_and_anything_else_passes_through() -> None:
    mapping = ExceptionMap(
        (ConnectionResetError, lambda exc: ConnectionLost("first")),
        (OSError, lambda exc: ConnectionLost("second")),
    )
    with pytest.raises(ConnectionLost, match="first"), mapping:
        raise ConnectionResetError()
    with pytest.raises(ConnectionLost, match="second"), mapping:
        raise BrokenPipeError()
    with pytest.raises(ValueError), mapping:
        raise ValueError()
    with mapping:  # reusable, and silent without an exception
        pass


async def test_cancellation_is_never_mapped() -> None:
    with trio.move_on_after(0.01) as scope, EDGE:
        await trio.sleep(10)
    assert scope.cancelled_caught
