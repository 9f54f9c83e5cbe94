"""``Idempotency-Key`` across a restart: ``figtank serve`` is a real subprocess, killed
(SIGKILL) right after its answers and started again on the same data directory; a retry
with a key is answered as before, byte for byte, and never appended twice."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
from pathlib import Path

from tests.serving import figtank_serve


def post(address: tuple[str, int] | None, path: str, body: bytes,
         headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    assert address is not None
    conn = http.client.HTTPConnection(*address, timeout=20)
    try:
        conn.request("POST", path, body, headers)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def messages(address: tuple[str, int] | None, topic: str, partition: int) -> list[str]:
    assert address is not None
    conn = http.client.HTTPConnection(*address, timeout=20)
    try:
        conn.request("GET", f"/topics/{topic}/partitions/{partition}/messages?offset=0")
        return [m["value"] for m in json.loads(conn.getresponse().read())["messages"]]
    finally:
        conn.close()


def serve_args(data: Path, *more: str) -> tuple[str, ...]:
    return ("--data-dir", str(data), "--http-listen", "127.0.0.1:0", "--tank-listen", "",
            "--figg-listen", "", "--kafka-listen", "", "--metrics-listen", "",
            "--default-partitions", "2", *more)


def test_keys_and_answers_outlive_a_killed_gateway(tmp_path: Path) -> None:
    data = tmp_path / "data"
    big = base64.b64encode(os.urandom(6000)).decode()
    batch = b"".join(json.dumps(line).encode() + b"\n" for line in (
        {"value": "a", "partition": 1}, {"value": big, "partition": 0},
        {"value": "b", "partition": 1}))
    ndjson = {"Content-Type": "application/x-ndjson"}
    with figtank_serve(*serve_args(data, "--max-bundle-bytes", "4096")) as server:
        done = post(server.http, "/topics/single", b"hello", {"Idempotency-Key": "done-1"})
        assert done[0] == 200
        part = post(server.http, "/topics/kept", batch, {**ndjson, "Idempotency-Key": "part-1"})
        assert part[0] >= 400 and json.loads(part[2])["stored"] == 2
        server.stop(signal.SIGKILL)
    # Started again with room for the big message (the limit that refused it raised).
    with figtank_serve(*serve_args(data)) as server:
        again = post(server.http, "/topics/single", b"hello", {"Idempotency-Key": "done-1"})
        assert again[0] == 200 and again[2] == done[2]
        assert again[1]["idempotent-replayed"] == "true"
        resumed = post(server.http, "/topics/kept", batch,
                       {**ndjson, "Idempotency-Key": "part-1"})
        assert resumed[0] == 200, resumed[2]
        offsets = json.loads(resumed[2])["offsets"]
        assert [offsets[0], offsets[2]] == json.loads(part[2])["offsets"][0::2]
        # Another body under a known key: refused, nothing appended.
        reused = post(server.http, "/topics/single", b"other", {"Idempotency-Key": "done-1"})
        assert reused[0] == 422
        assert messages(server.http, "kept", 1) == ["a", "b"]
        assert messages(server.http, "kept", 0) == [big]
        single = messages(server.http, "single", 0) + messages(server.http, "single", 1)
        assert single == ["hello"]
        assert server.stop() == 0


def test_a_single_message_key_survives_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with figtank_serve(*serve_args(data)) as server:
        first = post(server.http, "/topics/solo?partition=0", b"only once",
                     {"Idempotency-Key": "solo"})
        assert first[0] == 200
        server.stop(signal.SIGKILL)
    with figtank_serve(*serve_args(data)) as server:
        again = post(server.http, "/topics/solo?partition=0", b"only once",
                     {"Idempotency-Key": "solo"})
        assert (again[0], again[2]) == (first[0], first[2])
        assert messages(server.http, "solo", 0) == ["only once"]
