"""``GET /api/overview``: what the web console shows, as JSON.

Topics and their partitions' first and last offsets (only those the principal may see,
at most :data:`MAX_TOPICS`), the counters the console turns into rates (messages
appended per topic, messages delivered), connections by protocol, and the Kafka consumer
groups' lag per partition, read from the server's metrics, so the listener needs nothing
but the backend and the registry.

The hot paths count appends as plain totals that reach their counters only on
:meth:`~gateway.core.metrics.Metrics.flush` (done by a ``/metrics`` scrape): the
overview flushes first, or its counters would stand still whenever nothing scrapes. A
flush is one pass over the per-topic totals and request counters, the same order of work
as the collect that follows, so it runs on every read.
"""

from __future__ import annotations

from typing import Final

from gateway.auth.policy import Operation
from gateway.core.contract import ensure_available
from gateway.core.metrics import Metrics
from gateway.http.auth import access_of, require_some_access
from gateway.http.request import Answer, Request, json_answer
from gateway.http.session import HttpSession

MAX_TOPICS: Final = 200
_WANTED = {"figtank_messages_in", "figtank_messages_out", "figtank_connections",
           "figtank_committed_lag_messages"}


def _samples(metrics: Metrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in _WANTED}
    metrics.flush()
    for family in metrics.registry.collect():
        if family.name in _WANTED:
            out[family.name] = [(s.labels, s.value) for s in family.samples
                                if not s.name.endswith("_created")]
    return out


async def overview(session: HttpSession, request: Request) -> Answer:
    access = access_of(session, request)
    require_some_access(session, access, "see the overview")
    ensure_available(session.listener.backend)
    listener = session.listener
    backend = listener.backend
    samples = _samples(listener.metrics)
    appended = {labels["topic"]: value for labels, value in samples["figtank_messages_in"]}
    topics = []
    found = sorted(await backend.discover_topics(), key=lambda t: t.name)
    visible = [t for t in found if access.may_see(t.name)]
    for topic in visible[:MAX_TOPICS]:
        infos = await backend.discover_partitions(topic.name) or []
        topics.append({"name": topic.name, "messages_in": appended.get(topic.name, 0),
                       "partitions": [{"partition": i,
                                       "first_offset": max(info.first_available, 1)
                                       if info.high_water_mark else 0,
                                       "last_offset": info.high_water_mark}
                                      for i, info in enumerate(infos)]})
    connections: dict[str, float] = {}
    for labels, value in samples["figtank_connections"]:
        connections[labels["protocol"]] = connections.get(labels["protocol"], 0) + value
    groups = [{"group": labels["group"], "topic": labels["topic"],
               "partition": int(labels["partition"]), "lag": value}
              for labels, value in samples["figtank_committed_lag_messages"]
              if access.may_group(labels["group"], Operation.DISCOVER)
              and access.may_see(labels["topic"])]
    return json_answer({
        "topics": topics, "more_topics": max(len(visible) - MAX_TOPICS, 0),
        "published": sum(appended.values()),
        "delivered": sum(v for _, v in samples["figtank_messages_out"]),
        "connections": connections, "streams": dict(listener.streams), "groups": groups})
