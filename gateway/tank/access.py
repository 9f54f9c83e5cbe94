"""The access policy on a Tank connection: what each refused request is answered.

- Produce (and ProduceWithSeqnum) to a topic without ``publish``: the topic-wide
  read-only code ``0xfe``; to a missing topic the backend would create but the principal
  may not (no ``create``): unknown topic ``0xff``, as a broker without auto-creation.
  The other topics of the request are appended as usual.
- Consume of a topic without ``subscribe``: the unknown-topic sentinel (``u16 0xFFFF``),
  so a consumer learns nothing of topics it may not read.
- CreateTopic without ``create``: code 5 (read-only). ReloadConf without ``configure``:
  code 11 (unknown topic: ReloadConf has no read-only code).
- DiscoverPartitions of a topic the principal may do nothing with: unknown topic (no
  partitions); DiscoverTopics lists only the topics it may do something with.
- Status without ``admin``: the connection is closed (Status has no error code).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.core.contract import (
    FetchOutcome,
    FetchRequest,
    FetchStatus,
    ProduceBatch,
    ProduceCode,
    ProduceOutcome,
)
from gateway.serving.session import CloseConnection
from gateway.tank.admin import AdminRequest, AdminResponse
from gateway.tank.produce import AnyProduce, produce_batches
from protocols.tank.messages import (
    ConsumeRequest,
    CreateTopicRequest,
    CreateTopicResponse,
    DiscoverPartitionsRequest,
    DiscoverPartitionsResponse,
    DiscoverTopicsResponse,
    ReloadConfRequest,
    ReloadConfResponse,
    StatusRequest,
)
from protocols.tank.types import CreateTopicError, ReloadConfError

_READ_ONLY: Final = ProduceOutcome(ProduceCode.READ_ONLY, reason="refused by the access policy")
_NOT_CREATED: Final = ProduceOutcome(ProduceCode.UNKNOWN_TOPIC,
                                     reason="unknown topic (the access policy refuses its "
                                            "creation)")
#: ReloadConf's answer to a principal without ``configure``.
RELOAD_CONF_REFUSED: Final = ReloadConfError.UNKNOWN_TOPIC

Merge = Callable[[list[ProduceOutcome]], list[ProduceOutcome]]


def guarded_produce(access: ConnectionAccess, request: AnyProduce, auto_create: bool,
                    kind: str) -> tuple[list[ProduceBatch], Merge | None]:
    """The batches of ``request`` to append and, when the policy refused some topics,
    how to make the appended ones' outcomes the outcomes of the whole request. Topics
    still to look up (:func:`gateway.serving.lookup.topics_to_look_up`) count as missing."""
    batches = produce_batches(request)
    refused: dict[str, ProduceOutcome] = {}
    for topic in request.topics:
        name = topic.name
        if name in refused:
            continue
        if not access.may(name, Operation.PUBLISH):
            refused[name] = _READ_ONLY
            access.refused(name, Operation.PUBLISH, kind, "read-only (0xfe)")
        elif access.must_look_up(name, auto_create):
            refused[name] = _NOT_CREATED
            access.refused(name, Operation.CREATE, kind, "unknown topic (0xff)")
    if not refused:
        return batches, None
    kept = [b for b in batches if b.topic not in refused]

    def merge(outcomes: list[ProduceOutcome]) -> list[ProduceOutcome]:
        given = iter(outcomes)
        return [refused[b.topic] if b.topic in refused else next(given) for b in batches]

    return kept, merge


def hidden_topics(access: ConnectionAccess, request: ConsumeRequest) -> set[str] | None:
    """The topics of a Consume the principal may not read (each counted and logged), or
    None when it may read them all."""
    hidden = None
    for topic in request.topics:
        name = topic.name
        if not access.may(name, Operation.SUBSCRIBE):
            if hidden is None:
                hidden = set()
            if name not in hidden:
                hidden.add(name)
                access.refused(name, Operation.SUBSCRIBE, "consume", "unknown topic")
    return hidden


def visible(asked: list[FetchRequest], hidden: set[str] | None) -> list[FetchRequest]:
    """The fetches of a Consume that are not of ``hidden`` topics."""
    return asked if hidden is None else [f for f in asked if f.topic not in hidden]


def with_hidden(asked: list[FetchRequest], hidden: set[str] | None,
                outcomes: list[FetchOutcome]) -> list[FetchOutcome]:
    """The outcomes of every fetch of ``asked``: those of the visible ones, and unknown
    topic for the hidden."""
    if hidden is None:
        return outcomes
    given = iter(outcomes)
    return [FetchOutcome(FetchStatus.UNKNOWN_TOPIC) if f.topic in hidden else next(given)
            for f in asked]


def refused_admin(access: ConnectionAccess, request: AdminRequest, kind: str
                  ) -> AdminResponse | None:
    """The answer to an admin request the policy refuses, or None when it is allowed.
    Raises :class:`CloseConnection` for a refused Status."""
    if type(request) is CreateTopicRequest:
        if not access.may(request.topic, Operation.CREATE):
            access.refused(request.topic, Operation.CREATE, kind, "read-only (5)")
            return CreateTopicResponse(request.request_id, request.topic,
                                       int(CreateTopicError.READ_ONLY))
    elif type(request) is ReloadConfRequest:
        if not access.may(request.topic, Operation.CONFIGURE):
            access.refused(request.topic, Operation.CONFIGURE, kind, "unknown topic (11)")
            return ReloadConfResponse(request.request_id, request.topic, request.partition,
                                      RELOAD_CONF_REFUSED)
    elif type(request) is DiscoverPartitionsRequest:
        if not access.may_see(request.topic):
            access.refused(request.topic, "discover", kind, "unknown topic")
            return DiscoverPartitionsResponse(request.request_id, request.topic, [])
    elif type(request) is StatusRequest and not access.may(None, Operation.ADMIN):
        access.refused(None, Operation.ADMIN, kind, "connection closed")
        raise CloseConnection("access_denied", f"{access.principal.name} may not ask for "
                              "Status (admin)")
    return None


def visible_topics(access: ConnectionAccess, response: DiscoverTopicsResponse
                   ) -> DiscoverTopicsResponse:
    """A DiscoverTopics response without the topics the principal may do nothing with."""
    if access.open:
        return response
    return DiscoverTopicsResponse(response.request_id,
                                  [t for t in response.topics if access.may_see(t.name)])
