"""A data disk that turns read-only or fails (EIO) under a real ``figtank serve``: an ext4
image on a loop device, made read-only by an error ext4 finds (``errors=remount-ro``) or
shut down (``EXT4_IOC_SHUTDOWN``: every write and fsync fails with EIO).

Every protocol answers a publish as the server's fault (HTTP 503 ``disk_read_only`` / 500
``disk_error``, Tank's I/O fault, KAFKA_STORAGE_ERROR, a WebSocket error naming the disk, a
Figg close whose logged reason names it), for new topics too; ``/health`` says why it is
not ready; the failures are counted by kind. Such a filesystem is only usable again once
mounted again: after a restart on it, every message acknowledged before the fault is
there and publishes go on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.client.tank import open_tank_client
from protocols.kafka import records as r
from protocols.kafka.batch import Record, RecordBatch, encode_batch, encode_records
from protocols.kafka.types import ApiKey, ErrorCode
from tests.disks import ext4
from tests.figg.helpers import RawPeer, publish
from tests.http.ws_client import WsClient
from tests.kafka.raw import call
from tests.serving import figtank_serve
from tests.test_disk_full import TANK_IO_FAULT, _bundle, http_post, metric, wait_health
from tests.test_serve import http_get

MIB = 1024 * 1024
ANY_PORT = "127.0.0.1:0"
#: Per fault: the HTTP status and error, the words naming it, the failures' metric kind.
FAULTS = {"read_only": (503, "disk_read_only", "disk read-only", "read_only"),
          "io_error": (500, "disk_error", "disk I/O error", "io_error")}


def _records(value: bytes) -> bytes:
    recs = [Record(offset_delta=0, timestamp_delta=0, key=None, value=value)]
    return encode_batch(RecordBatch(base_offset=0, base_timestamp=1, max_timestamp=1,
                                    last_offset_delta=0), encode_records(recs), 1)


def _serve(data: Path):  # type: ignore[no-untyped-def]
    return figtank_serve("--data-dir", str(data), "--tank-listen", ANY_PORT,
                         "--figg-listen", ANY_PORT, "--kafka-listen", ANY_PORT,
                         "--http-listen", ANY_PORT, "--metrics-listen", ANY_PORT,
                         "--grace", "0.5")


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_failing_disk_is_a_server_fault_and_loses_nothing(tmp_path: Path,
                                                                  fault: str) -> None:
    status, error, words, kind = FAULTS[fault]
    acked: list[bytes] = []
    with ext4(tmp_path / "disk", 32 * MIB) as fs:
        with _serve(fs.path / "data") as server:
            assert server.http and server.tank and server.kafka and server.figg
            for i in range(3):
                value = b"before %d" % i
                assert (await trio.to_thread.run_sync(
                    http_post, server.http, "/topics/orders", value))[0] == 200
                acked.append(value)
            if fault == "read_only":
                fs.make_read_only()
            else:
                fs.shut_down()
            for topic in ("orders", "fresh"):
                got, answer, _ = await trio.to_thread.run_sync(
                    http_post, server.http, f"/topics/{topic}", b"refused")
                assert (got, answer["error"]) == (status, error), answer
                assert words in answer["message"]
            async with open_tank_client(*server.tank) as tank:
                codes = await tank.produce_raw([("orders", 0, _bundle(b"t"), None),
                                                ("tankfresh", 0, _bundle(b"t"), None)])
            assert codes == [TANK_IO_FAULT, TANK_IO_FAULT]
            stream = await trio.open_tcp_stream(*server.kafka)
            async with stream:
                _, produced = await call(stream, ApiKey.PRODUCE, 8, r.ProduceRequest(
                    acks=-1, timeout_ms=1000, topic_data=[r.TopicProduceData("orders", [
                        r.PartitionProduceData(0, _records(b"k"))])]))
                _, meta = await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(
                    topics=[r.MetadataRequestTopic(name="kfresh")]), 2)
            answer_part = produced.responses[0].partition_responses[0]
            assert answer_part.error_code == ErrorCode.KAFKA_STORAGE_ERROR
            assert words in answer_part.error_message
            assert [t.error_code for t in meta.topics] == [ErrorCode.KAFKA_STORAGE_ERROR]
            ws = await WsClient.connect(*server.http)
            assert (await ws.next())["op"] == "hello"
            await ws.send({"op": "publish", "topic": "orders", "value": "w", "id": 1})
            assert (await ws.next())["error"] == error
            await ws.aclose()
            peer = RawPeer(await trio.open_tcp_stream(*server.figg))
            await peer.send(publish("orders", 1, b"f"))
            with trio.fail_after(10):
                await peer.expect_closed()
            await peer.aclose()
            health = await trio.to_thread.run_sync(wait_health, server, 503)
            assert health[0] == 503 and health[1].startswith(f"store not writable: {words}")
            assert http_get(server.metrics, "/livez")[0] == 200  # type: ignore[arg-type]
            text = http_get(server.metrics, "/metrics")[1]  # type: ignore[arg-type]
            assert (metric(text, "figtank_store_write_failures_total", kind=kind) or 0) >= 2
            server.stop()
        closes = [line for line in server.events("connection_closed")
                  if line.get("kind") == "publish_failed"]
        assert len(closes) == 1 and words in closes[0]["reason"], closes
        # Mounted again (after the process let go of it): nothing acknowledged is lost.
        fs.unmount()
        fs.mount()
        with _serve(fs.path / "data") as again:
            assert again.http and again.tank and again.metrics
            assert http_get(again.metrics, "/health") == (200, "ready\n")
            assert (await trio.to_thread.run_sync(
                http_post, again.http, "/topics/orders", b"after"))[0] == 200
            acked.append(b"after")
            async with open_tank_client(*again.tank) as tank:
                got = await tank.consume("orders", 0, 1)
            assert again.stop() == 0
    assert [m.value for m in got.messages] == acked
