"""The Tank client's raw calls the bridge is built on: ``produce_raw`` and ``consume_raw``."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.client.tank import open_tank_client
from protocols.tank.bundle import Message, decode_chunk, encode_bundle
from protocols.tank.types import ConsumeFlags, ProduceError
from tests.bridge.helpers import upstream_server


def bundle(*values: bytes) -> bytes:
    return encode_bundle([Message(v, timestamp=1000) for v in values])


async def test_produce_raw_and_consume_raw(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with upstream_server(tmp_path / "up", auto_create_topics=False) as up, \
                open_tank_client(*up.tank, request_timeout=5) as client:
            await client.create_topic("a", 2)
            codes = await client.produce_raw([
                ("a", 0, bundle(b"1"), None), ("missing", 0, bundle(b"x"), None),
                ("a", 1, bundle(b"2"), None), ("a", 0, bundle(b"3", b"4"), None),
                ("a", 9, bundle(b"x"), None)])
            assert codes == [ProduceError.OK, ProduceError.UNKNOWN_TOPIC, ProduceError.OK,
                             ProduceError.OK, ProduceError.UNKNOWN_PARTITION]
            assert await client.produce_raw([("a", 1, bundle(b"9"), 20)]) == [0]
            with pytest.raises(ValueError):
                await client.produce_raw([("a", 1, bundle(b"x"), 30), ("a", 0, b"", None)])

            # Unknown topic, sparse bundle, boundary, and one partition asked twice.
            results = await client.consume_raw(
                [("a", 0, 2, 1024), ("missing", 0, 1, 1024), ("a", 1, 20, 1024),
                 ("a", 0, 99, 1024), ("a", 0, 3, 1024)])
            first, unknown, seqnum, boundary, again = results
            assert unknown is None
            assert first is not None and first.flags == ConsumeFlags.OK
            assert first.high_water_mark == 3
            decoded = decode_chunk(first.chunk, first.base_seq_num)
            # Whole bundles from the one holding sequence 2.
            assert [(m.seq, m.value) for m in decoded.messages] == [(2, b"3"), (3, b"4")]
            # After a gap the store keeps a sparse bundle: it names its own sequences.
            assert seqnum is not None and seqnum.flags == ConsumeFlags.SPARSE_FIRST_BUNDLE
            assert [m.seq for m in decode_chunk(seqnum.chunk, None).messages] == [20]
            assert boundary is not None and boundary.flags == ConsumeFlags.BOUNDARY_CHECK
            assert (boundary.first_available_seq_num, boundary.high_water_mark) == (1, 3)
            assert again is not None and again.chunk == first.chunk

            # A long poll: nothing at the tail, the wait runs out, the chunk is empty.
            started = trio.current_time()
            [waited] = await client.consume_raw([("a", 0, 4, 1024)], max_wait_ms=200,
                                                min_bytes=1)
            assert waited is not None and not waited.chunk
            assert trio.current_time() - started >= 0.19
