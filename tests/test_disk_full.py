"""A full disk under a real ``figtank serve``: a 16 MiB tmpfs filled past the free-space
floor by a file beside the data directory.

Every protocol answers a publish it can not store as the server's fault (HTTP 507, Tank's
I/O fault, KAFKA_STORAGE_ERROR, a WebSocket ``disk_full`` error, a Figg close whose logged
reason names the disk), to an existing topic and to a new one alike (never "unknown
topic" or a policy refusal); ``/health`` and ``/readyz`` say why they are not ready while
``/livez`` stays live; the metrics count the refusals by outcome; the log says it once, not
once per refused append. Once the file is removed the server is ready again, publishes go
on without a restart, and every message acknowledged before is there.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio
from kafka import KafkaProducer
from kafka.errors import KafkaStorageError

from gateway.client.tank import open_tank_client
from protocols.kafka import records as r
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.tank.bundle import Message, encode_bundle
from tests.disks import fill, tmpfs
from tests.figg.helpers import RawPeer, attach, publish
from tests.http.ws_client import WsClient
from tests.kafka.raw import call
from tests.serving import ServeProcess, figtank_serve
from tests.test_serve import http_get

MIB = 1024 * 1024
ANY_PORT = "127.0.0.1:0"
#: The tank produce code of an I/O fault (Tank's only server-side failure code).
TANK_IO_FAULT = 2


def http_post(address: tuple[str, int], path: str, body: bytes) -> tuple[int, dict[str, Any],
                                                                          dict[str, str]]:
    """``(status, JSON body, headers)`` of a POST."""
    request = urllib.request.Request(f"http://{address[0]}:{address[1]}{path}", data=body,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), _lower(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), _lower(exc.headers)


def _lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a ``/metrics`` text, or None."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" (\S+)"
    found = re.search("^" + pattern + "$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def wait_health(server: ServeProcess, status: int, timeout: float = 10) -> tuple[int, str]:
    """Poll ``/health`` until it answers ``status``; the last answer."""
    assert server.metrics is not None
    deadline = time.monotonic() + timeout
    while True:
        answer = http_get(server.metrics, "/health")
        if answer[0] == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def wait_metric(server: ServeProcess, name: str, value: float, labels: dict[str, str],
                timeout: float = 10) -> bool:
    """Poll ``/metrics`` until the sample says ``value``; whether it did."""
    assert server.metrics is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(http_get(server.metrics, "/metrics")[1], name, **labels) == value:
            return True
        time.sleep(0.1)
    return False


@contextmanager
def full_disk(tmp_path: Path) -> Iterator[tuple[ServeProcess, Path, dict[str, list[bytes]]]]:
    """A server on a 16 MiB tmpfs holding a few acknowledged messages, then filled below
    its floor by ``filler``: ``(server, filler, {topic: values acknowledged})``."""
    with tmpfs(tmp_path / "disk", 16 * MIB) as disk, figtank_serve(
            "--data-dir", str(disk / "data"), "--tank-listen", ANY_PORT,
            "--figg-listen", ANY_PORT, "--kafka-listen", ANY_PORT, "--http-listen", ANY_PORT,
            "--metrics-listen", ANY_PORT, "--grace", "0.5") as server:
        assert server.http and server.tank and server.kafka
        acked: dict[str, list[bytes]] = {"orders": []}
        for i in range(3):
            value = b"before %d " % i + b"." * 1000
            status, answer, _ = http_post(server.http, "/topics/orders", value)
            assert status == 200, answer
            acked["orders"].append(value)
        assert http_get(server.metrics, "/health") == (200, "ready\n")  # type: ignore[arg-type]
        _, text = http_get(server.metrics, "/metrics")  # type: ignore[arg-type]
        floor = metric(text, "figtank_store_min_free_bytes", directory=str(disk / "data"))
        # 5 % of 16 MiB: the floor for a small disk (store.min_free_bytes is 256 MiB).
        assert floor == int(16 * MIB * 5 / 100)
        filler = fill(disk / "filler", leave=int(floor) // 2)
        # Another writer filled the disk: the server sees it at its next look (every s).
        assert wait_health(server, 503)[0] == 503
        yield server, filler, acked


async def test_a_full_disk_is_a_server_fault_on_every_protocol(tmp_path: Path) -> None:
    with full_disk(tmp_path) as (server, _, _):
        assert server.http and server.tank and server.kafka and server.figg
        # HTTP: 507 with Retry-After, for a topic there and for a new one (not 404).
        for topic in ("orders", "fresh"):
            status, answer, headers = await trio.to_thread.run_sync(
                http_post, server.http, f"/topics/{topic}", b"x" * 2000)
            assert (status, answer["error"]) == (507, "disk_full"), answer
            assert "disk full" in answer["message"]
            assert headers["retry-after"] == "1"
        # Tank: the I/O fault code, for a new topic too (not 0xff "no such topic").
        async with open_tank_client(*server.tank) as tank:
            codes = await tank.produce_raw([("orders", 0, _bundle(b"t1"), None),
                                            ("tankfresh", 0, _bundle(b"t2"), None)])
        assert codes == [TANK_IO_FAULT, TANK_IO_FAULT]
        # Kafka: KAFKA_STORAGE_ERROR from kafka-python's producer (no retries: the answer
        # itself), and from Metadata and CreateTopics for a topic that can not be created.
        error = await trio.to_thread.run_sync(_kafka_python_produce, server.kafka, "orders")
        assert isinstance(error, KafkaStorageError), error
        stream = await trio.open_tcp_stream(*server.kafka)
        async with stream:
            _, meta = await call(stream, ApiKey.METADATA, 9, r.MetadataRequest(
                topics=[r.MetadataRequestTopic(name="kfresh")], allow_auto_topic_creation=True))
            _, created = await call(stream, ApiKey.CREATE_TOPICS, 5, r.CreateTopicsRequest(
                topics=[r.CreatableTopic(name="kcreated", num_partitions=1,
                                         replication_factor=1)]), 2)
        assert [t.error_code for t in meta.topics] == [ErrorCode.KAFKA_STORAGE_ERROR]
        assert [t.error_code for t in created.topics] == [ErrorCode.KAFKA_STORAGE_ERROR]
        assert "disk full" in created.topics[0].error_message
        # WebSocket: an error message naming the disk for each publish, the socket open.
        ws = await WsClient.connect(*server.http)
        assert (await ws.next())["op"] == "hello"
        for i, topic in enumerate(("orders", "wsfresh")):
            await ws.send({"op": "publish", "topic": topic, "value": "w", "id": i})
            answer = await ws.next()
            assert (answer["op"], answer["error"], answer["id"]) == ("error", "disk_full", i)
            assert "disk full" in answer["message"] and answer["retry_after_ms"] > 0
        await ws.send({"op": "ping", "ts": 7})
        assert await ws.next() == {"op": "pong", "ts": 7}
        assert ws.closed is None
        await ws.aclose()
        # Figg: the connection closes without an ACK; its logged reason names the disk.
        # An ATTACH to a topic that can not be created closes as a store fault too.
        for frame in (publish("orders", 1, b"f"), publish("figgfresh", 1, b"f"),
                      attach("figgsub", 0)):
            peer = RawPeer(await trio.open_tcp_stream(*server.figg))
            await peer.send(frame)
            with trio.fail_after(10):
                await peer.expect_closed()
            await peer.aclose()
        # A rendering of /metrics answers the scrapes of the next second (the fixture's
        # scrape too, on a fast run): wait for one made after the Figg closes.
        assert await trio.to_thread.run_sync(
            wait_metric, server, "figtank_requests_total", 2,
            {"protocol": "figg", "type": "publish", "result": "error"})
        _, text = await trio.to_thread.run_sync(http_get, server.metrics, "/metrics")
    closes = [line for line in server.events("connection_closed")
              if line.get("protocol") == "figg" or "figg" in str(line.get("listener"))]
    assert [line["kind"] for line in closes] == ["publish_failed", "publish_failed",
                                                 "store_fault"], closes
    assert all("disk full" in line["reason"] for line in closes), closes
    # Counted by outcome: the refused Figg publishes are errors, none is "ok".
    assert metric(text, "figtank_requests_total", protocol="figg", type="publish",
                  result="error") == 2
    assert metric(text, "figtank_requests_total", protocol="figg", type="publish",
                  result="ok") == 0
    assert metric(text, "figtank_requests_total", protocol="http", type="ws_publish",
                  result="error") == 2
    assert (metric(text, "figtank_store_write_failures_total", kind="below_floor") or 0) >= 8


async def test_health_metrics_and_log_while_full_then_publishes_resume(tmp_path: Path
                                                                         ) -> None:
    with full_disk(tmp_path) as (server, filler, acked):
        assert server.http and server.tank and server.metrics
        data_dir = str(filler.parent / "data")
        # A client retrying as fast as it can: 50 refusals, one log line.
        for _ in range(50):
            status, _, _ = await trio.to_thread.run_sync(http_post, server.http,
                                                         "/topics/orders", b"r" * 2000)
            assert status == 507
        status, reason = await trio.to_thread.run_sync(wait_health, server, 503)
        assert status == 503 and reason.startswith("store not writable: disk full: "), reason
        assert data_dir in reason
        assert http_get(server.metrics, "/readyz") == (status, reason)
        assert http_get(server.metrics, "/livez") == (200, "live\n")  # not a restart case
        # A rendering made after the refusals (one answers the scrapes of a second).
        assert wait_metric(server, "figtank_store_write_failures_total", 50,
                           {"kind": "below_floor"})
        _, text = http_get(server.metrics, "/metrics")
        assert metric(text, "figtank_store_writable", directory=data_dir) == 0
        free = metric(text, "figtank_store_free_bytes", directory=data_dir)
        floor = metric(text, "figtank_store_min_free_bytes", directory=data_dir)
        assert free is not None and floor is not None and free < floor
        assert metric(text, "figtank_store_write_failures_total", kind="below_floor") == 50
        assert metric(text, "figtank_store_write_failures_total", kind="no_space") == 0
        # Space comes back: ready again and publishes go on, without a restart.
        filler.unlink()
        assert await trio.to_thread.run_sync(wait_health, server, 200) == (200, "ready\n")
        status, answer, _ = await trio.to_thread.run_sync(http_post, server.http,
                                                          "/topics/orders", b"after")
        assert status == 200, answer
        acked["orders"].append(b"after")
        async with open_tank_client(*server.tank) as tank:
            await tank.produce({("orders", 0): [b"tank after"]})
            acked["orders"].append(b"tank after")
            got = await tank.consume("orders", 0, 1, fetch_size=1 << 20)
        # (A rendering serves the scrapes of the next second: poll.)
        assert await trio.to_thread.run_sync(
            wait_metric, server, "figtank_store_writable", 1.0, {"directory": data_dir})
        assert server.stop() == 0
    # Nothing acknowledged was lost, nothing refused was stored.
    assert [m.value for m in got.messages] == acked["orders"]
    refused = [line for line in server.log_lines if line.get("event") in (
        "store_write_refused", "append_failed", "store_write_failed")]
    assert [line["event"] for line in refused] == ["store_write_refused"], refused
    http_refusals = [line for line in server.events("http_request_refused")
                     if line.get("error") == "disk_full"]
    assert len(http_refusals) == 1, http_refusals
    assert [line["event"] for line in server.log_lines
            if line.get("event") in ("store_not_writable", "store_writable")] == [
        "store_not_writable", "store_writable"]


def _bundle(value: bytes) -> bytes:
    return encode_bundle([Message(value, timestamp=int(time.time() * 1000))])


def _kafka_python_produce(address: tuple[str, int], topic: str) -> BaseException | None:
    """Send one record with kafka-python, no retries; what its future failed with."""
    producer = KafkaProducer(bootstrap_servers=f"{address[0]}:{address[1]}", retries=0,
                             acks=1, request_timeout_ms=5000, max_block_ms=10000)
    try:
        producer.send(topic, b"k").get(timeout=10)
    except Exception as exc:
        return exc
    finally:
        producer.close(timeout=2)
    return None
