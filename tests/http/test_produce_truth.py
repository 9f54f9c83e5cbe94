"""An HTTP produce says what it stored, and a retry with its ``Idempotency-Key`` never
appends twice (gateway/http/produce.py, gateway/http/idempotency.py), over real loopback
sockets and a real store.

The partial failure is a real one: ``store.max_bundle_bytes`` refuses one partition's
batch (random bytes do not compress under it) while the other partition's is stored."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from gateway.http.idempotency import (
    BEGUN,
    COMPACT_MIN_BYTES,
    FILE_NAME,
    IdempotencyKeys,
    Limits,
    Remembered,
    fingerprint,
)
from tests.http.helpers import H11Client, http_server, http_settings
from tests.listeners import listening

NDJSON = ("content-type", "application/x-ndjson")


def ndjson(*lines: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def big_value(size: int = 6000) -> str:
    """Text that no codec shrinks below ``size`` / 2 bytes."""
    return base64.b64encode(os.urandom(size)).decode()


async def post(host: str, port: int, topic: str, body: bytes,
               headers: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, str], bytes]:
    client = await H11Client.connect(host, port)
    try:
        await client.send("POST", f"/topics/{topic}", body, headers)
        return await client.response()
    finally:
        await client.aclose()


async def stored(host: str, port: int, topic: str, partition: int) -> list[tuple[int, str]]:
    """(offset, value) of every message of the partition, read over HTTP."""
    client = await H11Client.connect(host, port)
    try:
        status, _, body = await client.request(
            "GET", f"/topics/{topic}/partitions/{partition}/messages?offset=0&max_count=1000")
    finally:
        await client.aclose()
    assert status == 200, body
    return [(m["offset"], m.get("value", "")) for m in body["messages"]]


async def test_a_batch_across_partitions_answers_what_each_stored(tmp_path: Path) -> None:
    async with http_server(tmp_path, default_partitions=2, max_bundle_bytes=4096) as s:
        body = ndjson({"value": "a", "partition": 1}, {"value": big_value(), "partition": 0},
                      {"value": "b", "partition": 1}, {"value": "c", "partition": 0})
        status, _, raw = await post(s.host, s.port, "split", body, [NDJSON])
        answer = json.loads(raw)
        # A refusal: the client must not take the batch as stored ...
        assert status >= 400, answer
        # ... and is told exactly what was: partition 1's two messages, not partition 0's.
        assert answer["stored"] == 2
        assert answer["offsets"][0] == {"partition": 1, "offset": 1}
        assert answer["offsets"][2] == {"partition": 1, "offset": 2}
        for refused in (answer["offsets"][1], answer["offsets"][3]):
            assert refused["partition"] == 0 and refused["offset"] is None
            assert refused["error"] == answer["error"]
        assert "2 of 4 messages not stored" in answer["message"]
        assert "split/0" in answer["message"]
        assert await stored(s.host, s.port, "split", 1) == [(1, "a"), (2, "b")]
        assert await stored(s.host, s.port, "split", 0) == []
        # One refused line and the request counted as an error, not as ok.
        assert s.metric('figtank_requests_total{protocol="http",result="error",'
                        'type="produce"}') == 1
        assert s.metric('figtank_requests_total{protocol="http",result="ok",'
                        'type="produce"}') is None


async def test_a_retried_key_is_answered_again_and_appended_once(tmp_path: Path) -> None:
    async with http_server(tmp_path) as s:
        key = [("idempotency-key", "order-42")]
        first = await post(s.host, s.port, "once", b"hello", key)
        again = await post(s.host, s.port, "once", b"hello", key)
        assert first[0] == again[0] == 200
        assert again[2] == first[2]  # the same bytes
        assert "idempotent-replayed" not in first[1]
        assert again[1]["idempotent-replayed"] == "true"
        # Another key is another request; no key at all appends every time.
        other = await post(s.host, s.port, "once", b"hello", [("idempotency-key", "order-43")])
        plain = await post(s.host, s.port, "once", b"hello")
        assert json.loads(other[2])["offsets"][0]["offset"] == 2
        assert json.loads(plain[2])["offsets"][0]["offset"] == 3
        assert [o for o, _ in await stored(s.host, s.port, "once", 0)] == [1, 2, 3]

        # The same key with another body: 422, nothing appended.
        status, _, raw = await post(s.host, s.port, "once", b"changed", key)
        assert status == 422 and json.loads(raw)["error"] == "idempotency_key_reused"
        # ... another topic, or another partition, is another request too.
        status, _, _ = await post(s.host, s.port, "elsewhere", b"hello", key)
        assert status == 422
        assert len(await stored(s.host, s.port, "once", 0)) == 3

        # A key over 255 characters is 400.
        status, _, raw = await post(s.host, s.port, "once", b"x",
                                    [("idempotency-key", "k" * 256)])
        assert status == 400 and json.loads(raw)["error"] == "bad_idempotency_key"
        assert s.metric('figtank_http_idempotency_requests_total{result="replayed"}') == 1
        assert s.metric('figtank_http_idempotency_requests_total{result="reused_key"}') == 2
        assert s.metric("figtank_http_idempotency_keys") == 2


async def test_concurrent_duplicates_wait_for_the_first(tmp_path: Path) -> None:
    settings = replace(http_settings(tmp_path), durability="fsync", http_listen="")
    async with listening("http", None, settings) as s:
        body = ndjson(*({"value": f"m{i}"} for i in range(50)))
        answers: list[tuple[int, dict[str, str], bytes]] = []

        async def send() -> None:
            answers.append(await post(s.host, s.port, "dup", body,
                                      [NDJSON, ("idempotency-key", "same")]))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(send)
        assert [a[0] for a in answers] == [200] * 8
        assert len({a[2] for a in answers}) == 1
        assert sum("idempotent-replayed" in a[1] for a in answers) == 7
        assert [v for _, v in await stored(s.host, s.port, "dup", 0)] == [
            f"m{i}" for i in range(50)]


async def test_a_retry_stores_only_what_was_not_stored(tmp_path: Path) -> None:
    """The refused partition's messages are appended by the retry, when the partition
    takes them (here: its bundle limit was the problem, and the client split nothing: the
    store's limit is raised between the tries by a restart on the same data directory)."""
    body = ndjson({"value": "a", "partition": 1}, {"value": big_value(), "partition": 0},
                  {"value": "b", "partition": 1})
    key = [NDJSON, ("idempotency-key", "batch-7")]
    async with http_server(tmp_path, default_partitions=2, max_bundle_bytes=4096) as s:
        status, _, raw = await post(s.host, s.port, "later", body, key)
        first = json.loads(raw)
        assert status >= 400 and first["stored"] == 2
        # Retried as it is: partition 1 is not appended again, partition 0 still refused.
        status, _, raw = await post(s.host, s.port, "later", body, key)
        assert status >= 400 and json.loads(raw)["offsets"] == first["offsets"]
        assert await stored(s.host, s.port, "later", 1) == [(1, "a"), (2, "b")]
        assert s.metric('figtank_http_idempotency_requests_total{result="resumed"}') == 1
    async with http_server(tmp_path, default_partitions=2) as s:
        status, _, raw = await post(s.host, s.port, "later", body, key)
        assert status == 200, raw
        done = json.loads(raw)
        assert done["offsets"] == [{"partition": 1, "offset": 1},
                                   {"partition": 0, "offset": 1},
                                   {"partition": 1, "offset": 2}]
        assert await stored(s.host, s.port, "later", 1) == [(1, "a"), (2, "b")]
        assert len(await stored(s.host, s.port, "later", 0)) == 1
        # Now complete: answered again as it is.
        again = await post(s.host, s.port, "later", body, key)
        assert again[0] == 200 and again[2] == raw


async def test_an_append_the_gateway_never_saw_end_is_not_repeated(tmp_path: Path) -> None:
    """A key whose last record says an append began, with no outcome (the gateway died
    in between): 409, nothing appended, as the messages may be stored already."""
    data = tmp_path / "data"
    data.mkdir()
    keys = IdempotencyKeys(data / FILE_NAME)
    keys.load()
    print_ = fingerprint("cut", "", None, None, None, b"payload")
    async with trio.open_nursery():
        await keys.remember("listener:http\ncut-1", Remembered(print_, BEGUN, b""))
    keys.close()
    async with http_server(tmp_path) as s:
        status, _, raw = await post(s.host, s.port, "cut", b"payload",
                                    [("idempotency-key", "cut-1")])
        assert status == 409 and json.loads(raw)["error"] == "idempotency_outcome_unknown"
        assert await stored(s.host, s.port, "cut", 0) == []


async def test_keys_are_bounded_in_count_and_age(tmp_path: Path) -> None:
    async with http_server(tmp_path, http_idempotency_max_keys=2,
                           http_idempotency_ttl_secs=0.5) as s:
        for key in ("k1", "k2", "k3"):
            assert (await post(s.host, s.port, "bounded", b"v",
                               [("idempotency-key", key)]))[0] == 200
        assert s.metric("figtank_http_idempotency_keys") == 2
        assert s.metric('figtank_limit_hits_total{limit="http.idempotency_max_keys"}') == 1
        # k1 was forgotten (the oldest): its retry is a new request; k3 is not.
        k1 = await post(s.host, s.port, "bounded", b"v", [("idempotency-key", "k1")])
        k3 = await post(s.host, s.port, "bounded", b"v", [("idempotency-key", "k3")])
        assert "idempotent-replayed" not in k1[1] and k3[1]["idempotent-replayed"] == "true"
        await trio.sleep(0.7)
        late = await post(s.host, s.port, "bounded", b"v", [("idempotency-key", "k3")])
        assert "idempotent-replayed" not in late[1]
        assert len(await stored(s.host, s.port, "bounded", 0)) == 5


async def test_the_file_survives_a_torn_tail_and_is_compacted(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    keys = IdempotencyKeys(path, Limits(max_keys=3))
    keys.load()
    for i in range(5):
        await keys.remember(f"p\nk{i}", Remembered("f", 200, b'{"n":%d}' % i))
    keys.close()
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x01\x00torn")
    again = IdempotencyKeys(path, Limits(max_keys=3))
    again.load()
    assert len(again) == 3
    async with again.claim("p\nk4") as held:
        assert held is not None and held.body == b'{"n":4}'
    async with again.claim("p\nk0") as held:
        assert held is None
    assert not path.read_bytes().endswith(b"torn")
    # Rewritten with the live records once it outgrows them: 2.4 MB written, the file
    # stays under its compaction threshold plus a record.
    big = IdempotencyKeys(path, Limits(max_keys=2))
    big.load()
    for i in range(40):
        await big.remember(f"p\nbig{i}", Remembered("f", 200, os.urandom(60_000)))
    assert path.stat().st_size < COMPACT_MIN_BYTES + 61_000
    big.close()
    last = IdempotencyKeys(path, Limits(max_keys=2))
    last.load()
    assert len(last) == 2
    async with last.claim("p\nbig39") as held:
        assert held is not None and len(held.body) == 60_000
    last.close()
