"""``GET /topics/{topic}/partitions/{p}/messages``: read a partition from an offset.

Parameters: ``offset`` (the first offset wanted; default the first available), or
``time`` instead (ISO 8601 with its zone: the first message at or after it, as SSE's
``from=`` finds it; past the last message, ``last_offset + 1``), ``max_count`` (default
100, at most 10,000), ``max_bytes`` (default 1 MiB, at most ``http.max_body_bytes`` x 8),
``wait_ms`` (long-poll: wait this long for a message when there is none yet; at most
``http.max_wait_ms``). An offset older than retention starts at the first available
message; one past the end waits for it (``last_offset + 1``) or is 416 beyond that.

JSON: ``{"topic", "partition", "messages": [...], "next_offset", "last_offset"}``; NDJSON
(``format=ndjson`` or ``Accept: application/x-ndjson``): one message a line, with
``Figtank-Next-Offset`` and ``Figtank-High-Water-Mark`` headers.

The answer's body counts against the principal's bytes-out quota; a request waits before
reading while the quota is in debt (:mod:`gateway.http.quota`). While the backend's
upstream is away: 503 ``unavailable`` with ``Retry-After`` (:mod:`gateway.http.outage`).
"""

from __future__ import annotations

from typing import Any

from gateway.auth.policy import Operation
from gateway.core.contract import FetchRequest, FetchStatus, ensure_available
from gateway.http.auth import access_of, check_topic_name, partition_param, require
from gateway.http.messages import decode_messages, dumps, message_json
from gateway.http.outage import unavailable_error
from gateway.http.positions import first_at_time, time_param
from gateway.http.quota import quota_of, took_out, wait_out
from gateway.http.request import NDJSON, Answer, HttpError, Request, json_answer
from gateway.http.session import HttpSession
from protocols.errors import ProtocolError

DEFAULT_COUNT = 100
MAX_COUNT = 10_000
DEFAULT_BYTES = 1024 * 1024


async def fetch(session: HttpSession, request: Request) -> Answer:
    topic = request.params["topic"]
    check_topic_name(topic)
    access = access_of(session, request)
    require(access, topic, Operation.SUBSCRIBE, "fetch")
    ensure_available(session.listener.backend)
    with quota_of(session, access.principal) as quota:
        await wait_out(quota)
        answer = await _fetch(session, request, topic)
        took_out(quota, len(answer.body))
    return answer


async def _fetch(session: HttpSession, request: Request, topic: str) -> Answer:
    backend = session.listener.backend
    settings = session.listener.settings
    infos = await backend.discover_partitions(topic)
    if infos is None:
        raise HttpError(404, "unknown_topic", f"unknown topic {topic!r}")
    partition = partition_param(request.params["partition"], len(infos), topic)
    assert partition is not None
    ndjson = request.wants_ndjson()
    max_count = min(request.int_param("max_count", DEFAULT_COUNT, minimum=1) or 1, MAX_COUNT)
    max_bytes = min(request.int_param("max_bytes", DEFAULT_BYTES, minimum=1) or 1,
                    settings.max_body_bytes * 8)
    wait_ms = min(request.int_param("wait_ms", 0) or 0, settings.max_wait_ms)
    info = infos[partition]
    offset = request.int_param("offset", max(info.first_available, 1))
    assert offset is not None
    when = request.query.get("time")
    if when:
        if request.query.get("offset"):
            raise HttpError(400, "bad_parameter", "give offset or time, not both")
        offset = await first_at_time(backend, topic, partition, time_param(when, "time"), info)
    if offset > info.high_water_mark + 1:
        raise HttpError(416, "offset_out_of_range", f"offset {offset} is past the end "
                        f"(last offset {info.high_water_mark})")
    offset = max(offset, info.first_available, 1)
    messages: list[dict[str, Any]] = []
    next_offset, hwm = offset, info.high_water_mark
    for _ in range(3):  # a retention boundary moves the start at most a couple of times
        fetch_request = FetchRequest(topic, partition, next_offset, max_bytes)
        [outcome] = await backend.fetch([fetch_request], max_wait_ms=wait_ms, min_bytes=1)
        hwm = outcome.high_water_mark or hwm
        if outcome.status is FetchStatus.BOUNDARY:
            next_offset = max(outcome.first_available, 1)
            continue
        if outcome.status is not FetchStatus.DATA:
            reason = backend.unavailable()
            if reason is not None and outcome.status is FetchStatus.FAULT:
                raise unavailable_error(f"{topic}/{partition}: {reason}")
            raise HttpError(503, "fetch_failed", f"{topic}/{partition}: "
                            f"{outcome.status.value}")
        chunk = outcome.chunk
        try:
            data = chunk.read_bytes() if chunk.length else b""
        finally:
            chunk.close()
        if data:
            try:
                found = decode_messages(data, outcome.base_seq, next_offset)
            except ProtocolError as exc:
                raise HttpError(500, "undecodable", str(exc)) from None
            size = 0
            for message in found.messages[:max_count]:
                size += len(message.value) + len(message.key or b"")
                if messages and size > max_bytes:
                    break
                messages.append(message_json(topic, partition, message))
            next_offset = (messages[-1]["offset"] + 1) if messages else found.next_seq
        break
    session.listener.metrics.requests.labels("http", "fetch", "ok").inc()
    if ndjson:
        body = b"".join(dumps(m) + b"\n" for m in messages)
        return Answer(200, NDJSON, body, [(b"figtank-next-offset", b"%d" % next_offset),
                                          (b"figtank-high-water-mark", b"%d" % hwm)])
    return json_answer({"topic": topic, "partition": partition, "messages": messages,
                        "next_offset": next_offset, "last_offset": hwm})
