"""``GET /topics`` and ``GET /topics/{topic}``: the topics, and one topic's partitions with
their first and last offsets, as JSON (only what the principal may see)."""

from __future__ import annotations

from gateway.core.contract import ensure_available
from gateway.http.auth import access_of, check_topic_name, require_some_access
from gateway.http.request import Answer, HttpError, Request, json_answer
from gateway.http.session import HttpSession


def _partition(number: int, first_available: int, high_water_mark: int) -> dict[str, int]:
    first = max(first_available, 1) if high_water_mark else 0
    messages = high_water_mark - first + 1 if high_water_mark and first <= high_water_mark else 0
    return {"partition": number, "first_offset": first, "last_offset": high_water_mark,
            "messages": messages}


async def list_topics(session: HttpSession, request: Request) -> Answer:
    access = access_of(session, request)
    require_some_access(session, access, "list topics")
    ensure_available(session.listener.backend)
    topics = await session.listener.backend.discover_topics()
    return json_answer({"topics": [{"name": t.name, "partitions": t.partitions}
                                   for t in sorted(topics, key=lambda t: t.name)
                                   if access.may_see(t.name)]})


async def describe_topic(session: HttpSession, request: Request) -> Answer:
    topic = request.params["topic"]
    check_topic_name(topic)
    access = access_of(session, request)
    require_some_access(session, access, "see topics")
    ensure_available(session.listener.backend)
    infos = await session.listener.backend.discover_partitions(topic)
    if infos is None or not access.may_see(topic):
        raise HttpError(404, "unknown_topic", f"unknown topic {topic!r}")
    return json_answer({"name": topic, "partitions": [
        _partition(i, info.first_available, info.high_water_mark)
        for i, info in enumerate(infos)]})
