"""``POST /topics/{topic}``: append a message, or a batch as NDJSON; answer once durable.

One message: the body is its value; ``Figtank-Key`` its key (``Figtank-Key-Base64`` for a
binary one); ``?partition=`` its partition. Content-Type ``application/x-ndjson``: each
line an object ``{"value" | "value_base64", "key" | "key_base64", "partition"}``. Without
a partition, a message with a key goes to ``crc32(key) % partitions`` (the same key, the
same partition), one without to the next partition in turn.

The answer (200) comes after the backend reports every append durable under
``store.durability``: ``{"topic", "offsets": [{"partition", "offset"}, ...]}`` in the
order of the messages (``offset`` is the Tank sequence, the Figg offset; null where an
upstream broker does not tell it). While the backend's upstream is away: 503
``unavailable`` with ``Retry-After`` (:mod:`gateway.http.outage`); when the store can not
write: 507 ``disk_full``, 503 ``disk_read_only``, 500 ``disk_error``
(:mod:`gateway.http.faults`).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import time
from typing import Any

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.auth.quotas import PrincipalQuota
from gateway.backend.contract import ProduceBatch, ProduceCode, ensure_available
from gateway.backend.placed import produce_placed
from gateway.http.auth import access_of, check_topic_name, partition_param, partitions_of, require
from gateway.http.faults import StoreFaultError
from gateway.http.messages import payload_of
from gateway.http.outage import FAILED_APPENDS, unavailable_error
from gateway.http.quota import quota_of
from gateway.http.request import Answer, HttpError, Request, json_answer
from protocols.tank.bundle import Message, encode_bundle

MAX_KEY: int = 255
_turns = itertools.count()

_STATUS = {ProduceCode.UNKNOWN_PARTITION: (404, "unknown_partition"),
           ProduceCode.READ_ONLY: (403, "read_only"),
           ProduceCode.UNKNOWN_TOPIC: (404, "unknown_topic"),
           ProduceCode.INVALID_SEQUENCE: (400, "invalid_sequence")}


def _key_of(request: Request) -> bytes | None:
    text = request.header("figtank-key")
    if text is not None:
        return text.encode("latin-1")  # the header's bytes as sent
    encoded = request.header("figtank-key-base64")
    if encoded is None:
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise HttpError(400, "bad_key", "Figtank-Key-Base64 is not base64") from None


def _ndjson(body: bytes) -> list[tuple[int | None, Message]]:
    out = []
    for number, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("expected a JSON object")
            value = payload_of(obj, "value")
            key = payload_of(obj, "key")
            partition = obj.get("partition")
            if partition is not None and (not isinstance(partition, int)
                                          or isinstance(partition, bool) or partition < 0):
                raise ValueError("partition must be an integer >= 0")
        except ValueError as exc:  # JSONDecodeError included
            raise HttpError(400, "malformed_json", f"line {number}: {exc}") from None
        if value is None:
            raise HttpError(400, "malformed_json", f"line {number}: no value")
        out.append((partition, Message(value, key)))
    if not out:
        raise HttpError(400, "malformed_json", "no message in the body")
    return out


def _partition_for(message: Message, count: int) -> int:
    if message.key:
        return binascii.crc32(message.key) % count
    return next(_turns) % count


async def produce(session: Any, request: Request) -> Answer:
    topic = request.params["topic"]
    check_topic_name(topic)
    access = access_of(session, request)
    require(access, topic, Operation.PUBLISH, "produce")
    content_type = (request.header("content-type") or "").split(";")[0].strip().lower()
    if content_type == "application/x-ndjson":
        wanted = _ndjson(request.body)
    else:
        wanted = [(None, Message(request.body, _key_of(request)))]
    for _, message in wanted:
        if message.key is not None and len(message.key) > MAX_KEY:
            raise HttpError(400, "bad_key", f"a key is at most {MAX_KEY} bytes")
    ensure_available(session.listener.backend)
    with quota_of(session, access.principal) as quota:
        return await _append(session, request, access, topic, wanted, quota)


async def _append(session: Any, request: Request, access: ConnectionAccess, topic: str,
                  wanted: list[tuple[int | None, Message]], quota: PrincipalQuota | None
                  ) -> Answer:
    if quota is not None and quota.reads_limited:
        await quota.wait_in()
    infos = await partitions_of(session, access, topic, "produce")
    access.seen(topic)
    default = partition_param(request.query.get("partition"), len(infos), topic)
    now = int(time.time() * 1000)
    by_partition: dict[int, list[Message]] = {}
    placed: list[tuple[int, int]] = []  # (partition, index in its batch)
    for explicit, message in wanted:
        partition = explicit if explicit is not None else default
        if partition is None:
            partition = _partition_for(message, len(infos))
        elif partition >= len(infos):
            raise HttpError(404, "unknown_partition", f"topic {topic!r} has {len(infos)} "
                            f"partitions, not {partition}")
        message.timestamp = now
        batch = by_partition.setdefault(partition, [])
        placed.append((partition, len(batch)))
        batch.append(message)
    batches = [ProduceBatch(topic, p, encode_bundle(m)) for p, m in by_partition.items()]
    outcomes = await produce_placed(session.listener.backend, batches)
    if quota is not None:
        quota.took_in(len(request.body), 1)
    first: dict[int, int | None] = {}
    for batch, outcome in zip(batches, outcomes, strict=True):
        if outcome.code is not ProduceCode.OK:
            session.listener.metrics.requests.labels("http", "produce", "error").inc()
            reason = session.listener.backend.unavailable()
            if reason is not None and outcome.code in FAILED_APPENDS:
                raise unavailable_error(f"append to {topic}/{batch.partition} failed: "
                                        f"{reason}")
            if outcome.fault:  # the store could not write: 507 / 503 / 500
                raise StoreFaultError(outcome.fault, f"append to {topic}/{batch.partition} "
                                      f"failed: {outcome.reason}")
            status, code = _STATUS.get(outcome.code, (503, "append_failed"))
            raise HttpError(status, code, f"append to {topic}/{batch.partition} failed: "
                            f"{outcome.code.name.lower()} {outcome.reason}".strip())
        first[batch.partition] = outcome.first_seq or None
    session.listener.metrics.requests.labels("http", "produce", "ok").inc()
    offsets = [{"partition": p, "offset": None if first[p] is None else first[p] + i}
               for p, i in placed]
    return json_answer({"topic": topic, "offsets": offsets})
