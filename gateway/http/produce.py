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
from gateway.backend.placed import produce_placed
from gateway.core.contract import (
    ProduceBatch,
    ProduceCode,
    ProduceOutcome,
    ensure_available,
)
from gateway.http.auth import access_of, check_topic_name, partition_param, partitions_of, require
from gateway.http.faults import StoreFaultError
from gateway.http.idempotency import (
    BEGUN,
    Remembered,
    answer_json,
    fingerprint,
    key_of,
    replay_headers,
    storage_error,
)
from gateway.http.messages import payload_of
from gateway.http.outage import FAILED_APPENDS, unavailable_error
from gateway.http.quota import quota_of
from gateway.http.request import JSON, Answer, HttpError, Request, error_answer, json_answer
from gateway.http.session import HttpSession
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


async def produce(session: HttpSession, request: Request) -> Answer:
    topic = request.params["topic"]
    check_topic_name(topic)
    access = access_of(session, request)
    require(access, topic, Operation.PUBLISH, "produce")
    content_type = _content_type(request)
    if content_type == "application/x-ndjson":
        wanted = _ndjson(request.body)
    else:
        wanted = [(None, Message(request.body, _key_of(request)))]
    for _, message in wanted:
        if message.key is not None and len(message.key) > MAX_KEY:
            raise HttpError(400, "bad_key", f"a key is at most {MAX_KEY} bytes")
    key = key_of(request.header("idempotency-key"))
    ensure_available(session.listener.backend)
    with quota_of(session, access.principal) as quota:
        if quota is not None and quota.reads_limited:
            await quota.wait_in()
        infos = await partitions_of(session, access, topic, "produce")
        access.seen(topic)
        placed = _place(request, topic, wanted, len(infos))
        try:
            if key is None:
                return _answered(await _store(session, topic, placed, None))
            return await _once(session, request, access, topic, key, placed)
        finally:
            if quota is not None:
                quota.took_in(len(request.body), 1)


def _content_type(request: Request) -> str:
    return (request.header("content-type") or "").split(";")[0].strip().lower()


def _place(request: Request, topic: str, wanted: list[tuple[int | None, Message]],
           count: int) -> list[tuple[int, Message]]:
    """Each message with the partition it goes to (404 for one the topic does not have)."""
    default = partition_param(request.query.get("partition"), count, topic)
    now = int(time.time() * 1000)
    placed = []
    for explicit, message in wanted:
        partition = explicit if explicit is not None else default
        if partition is None:
            partition = _partition_for(message, count)
        elif partition >= count:
            raise HttpError(404, "unknown_partition", f"topic {topic!r} has {count} "
                            f"partitions, not {partition}")
        message.timestamp = now
        placed.append((partition, message))
    return placed


async def _store(session: HttpSession, topic: str, placed: list[tuple[int, Message]],
                 before: list[dict[str, Any]] | None) -> Answer | HttpError:
    """Append the messages of ``placed`` (those ``before`` does not say stored), one batch a
    partition; the answer: 200 when every message is stored, else the refusal saying per
    message what was stored (``offsets``, an ``error`` where not) and why the rest was not.
    No partition's outcome is hidden by another's: an append is never all or nothing
    across partitions, so the answer says which parts were stored."""
    by_partition: dict[int, list[Message]] = {}
    where: list[tuple[int, int] | None] = []  # (partition, index in its batch) or kept
    for i, (partition, message) in enumerate(placed):
        if before is not None and before[i].get("error") is None:
            where.append(None)
            continue
        messages = by_partition.setdefault(partition, [])
        where.append((partition, len(messages)))
        messages.append(message)
    batches = [ProduceBatch(topic, p, encode_bundle(m)) for p, m in by_partition.items()]
    outcomes = await produce_placed(session.listener.backend, batches)
    first: dict[int, int | None] = {}
    errors: dict[int, HttpError] = {}
    for batch, outcome in zip(batches, outcomes, strict=True):
        if outcome.code is ProduceCode.OK:
            first[batch.partition] = outcome.first_seq or None
        else:
            errors[batch.partition] = _refusal(session, topic, batch.partition, outcome)
    offsets: list[dict[str, Any]] = []
    for i, spot in enumerate(where):
        if spot is None:
            assert before is not None
            offsets.append(before[i])
            continue
        partition, index = spot
        if partition in errors:
            offsets.append({"partition": partition, "offset": None,
                            "error": errors[partition].code})
        else:
            seq = first[partition]
            offsets.append({"partition": partition,
                            "offset": None if seq is None else seq + index})
    if not errors:
        session.listener.metrics.requests.labels("http", "produce", "ok").inc()
        return json_answer({"topic": topic, "offsets": offsets})
    session.listener.metrics.requests.labels("http", "produce", "error").inc()
    return _partial_refusal(topic, offsets, list(errors.values()))


def _refusal(session: HttpSession, topic: str, partition: int, outcome: ProduceOutcome
             ) -> HttpError:
    """Why one partition's batch was not stored, as a refusal."""
    reason = session.listener.backend.unavailable()
    if reason is not None and outcome.code in FAILED_APPENDS:
        return unavailable_error(f"append to {topic}/{partition} failed: {reason}")
    if outcome.fault:  # the store could not write: 507 / 503 / 500
        return StoreFaultError(outcome.fault, f"append to {topic}/{partition} failed: "
                               f"{outcome.reason}")
    status, code = _STATUS.get(outcome.code, (503, "append_failed"))
    return HttpError(status, code, f"append to {topic}/{partition} failed: "
                     f"{outcome.code.name.lower()} {outcome.reason}".strip())


def _partial_refusal(topic: str, offsets: list[dict[str, Any]],
                     errors: list[HttpError]) -> HttpError:
    """The refusal of a produce some of whose messages were not stored: the status and
    code of the gravest partition's refusal (a 5xx before a 4xx), every partition's reason,
    and per message what was stored."""
    worst = max(errors, key=lambda e: e.status // 100)
    missing = sum(1 for o in offsets if o.get("error") is not None)
    headers = list(dict.fromkeys(h for e in errors for h in e.headers))
    reasons = "; ".join(e.message for e in errors)
    return HttpError(worst.status, worst.code,
                     f"{missing} of {len(offsets)} messages not stored: {reasons}", headers,
                     {"topic": topic, "stored": len(offsets) - missing, "offsets": offsets})


def _answered(outcome: Answer | HttpError) -> Answer:
    if isinstance(outcome, HttpError):
        raise outcome
    return outcome


async def _once(session: HttpSession, request: Request, access: ConnectionAccess, topic: str,
                key: str, placed: list[tuple[int, Message]]) -> Answer:
    """A produce with an ``Idempotency-Key``: appended at most once whatever the retries
    (:mod:`gateway.http.idempotency`)."""
    keys = session.listener.idempotency
    scoped = f"{access.principal.name}\n{key}"
    print_ = fingerprint(topic, _content_type(request), request.header("figtank-key"),
                         request.header("figtank-key-base64"), request.query.get("partition"),
                         request.body)
    async with keys.claim(scoped) as held:
        before = None
        if held is not None:
            if held.fingerprint != print_:
                keys.counted("reused_key")
                raise HttpError(422, "idempotency_key_reused", "this Idempotency-Key was "
                                "used for another request; nothing was appended")
            if held.status == BEGUN:
                keys.counted("outcome_unknown")
                raise HttpError(409, "idempotency_outcome_unknown", "the gateway stopped "
                                "while the request with this Idempotency-Key was being "
                                "appended: its messages may be stored or not (read the "
                                "partitions); it is not appended again")
            if held.status == 200:
                keys.counted("replayed")
                return Answer(200, JSON, held.body, replay_headers())
            before = answer_json(held.body)["offsets"]
            placed = [(spot["partition"], message)
                      for spot, (_, message) in zip(before, placed, strict=True)]
        try:
            await keys.remember(scoped, Remembered(print_, BEGUN,
                                                   b"" if held is None else held.body))
        except OSError as exc:
            keys.restore(scoped, held)
            raise storage_error(exc, "could not record the Idempotency-Key") from None
        keys.counted("new" if held is None else "resumed")
        outcome = await _store(session, topic, placed, before)
        answer = error_answer(outcome) if isinstance(outcome, HttpError) else outcome
        try:
            await keys.remember(scoped, Remembered(print_, answer.status, answer.body))
        except OSError as exc:
            # The append's outcome stands; only a restart forgets it (then: unknown).
            session.log.error("idempotency_outcome_not_recorded", topic=topic,
                              error=exc.strerror or repr(exc),
                              action="kept in memory: after a restart a retry with the key "
                                     "is answered 409 idempotency_outcome_unknown")
        return _answered(outcome)
