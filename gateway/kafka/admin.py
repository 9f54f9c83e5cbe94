"""CreateTopics and DescribeConfigs (topics) on the Kafka listener.

CreateTopics makes each topic with the Backend's ``create_topic``: ``num_partitions`` -1
is ``topics.default_partitions``; the replication factor must be 1 or -1 (one broker);
explicit replica assignments are refused. Kafka config keys with a Tank equivalent are
translated (:data:`KAFKA_TO_TANK`); any other key is INVALID_CONFIG. ``validate_only``
checks everything but the store's limits and creates nothing.

DescribeConfigs describes topics only: the config in force under Kafka's names where
they exist, Tank's keys otherwise. Every entry is read-only (this listener serves no
AlterConfigs). Only the embedded store can say what a topic's config is; behind a Tank
broker (the bridge) a topic is answered with no entries.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.core.contract import Backend, CreateTopicCode
from gateway.store.config import TopicConfig
from gateway.store.errors import InvalidConfig
from protocols.kafka.records import (
    CreatableTopic,
    CreatableTopicConfig,
    CreatableTopicConfigs,
    CreatableTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
)
from protocols.kafka.types import ErrorCode, ResourceType
from protocols.topics import MAX_PARTITIONS, is_valid_topic_name

_LONG_MAX: Final = 2**63 - 1

# Kafka's ConfigSource values.
_TOPIC_CONFIG: Final = 1
_STATIC_BROKER_CONFIG: Final = 4
_DEFAULT_CONFIG: Final = 5


def _ms_to_secs(value: int) -> int:
    return 0 if value < 0 else value // 1000


def _unlimited(value: int) -> int:
    return 0 if value < 0 else value


#: Kafka topic config key -> (Tank key, the Kafka value turned into Tank's).
KAFKA_TO_TANK: Final[dict[str, tuple[str, Callable[[int], int]]]] = {
    "segment.bytes": ("log.segment.bytes", _unlimited),
    "retention.ms": ("log.retention.secs", _ms_to_secs),
    "retention.bytes": ("log.retention.bytes", _unlimited),
    "segment.ms": ("log.roll.secs", _ms_to_secs),
}


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def tank_config(configs: Sequence[CreatableTopicConfig]) -> str:
    """Tank's ``key=value`` text for CreateTopics ``configs``; :class:`_Refused`
    (INVALID_CONFIG) for a key without a Tank equivalent or a value that is no integer."""
    lines = []
    for entry in configs:
        if entry.value is None:  # null: the default
            continue
        mapped = KAFKA_TO_TANK.get(entry.name)
        if mapped is None:
            raise _Refused(ErrorCode.INVALID_CONFIG,
                           f"config {entry.name!r} is not supported (supported: "
                           f"{', '.join(KAFKA_TO_TANK)})")
        key, convert = mapped
        try:
            value = convert(int(entry.value))
        except ValueError:
            raise _Refused(ErrorCode.INVALID_CONFIG,
                           f"config {entry.name}={entry.value!r} is not an integer") from None
        lines.append(f"{key}={value}")
    return "\n".join(lines)


def _check(backend: Backend, topic: CreatableTopic) -> tuple[int, str]:
    """The partition count and config text of a CreatableTopic, or :class:`_Refused`."""
    name = topic.name
    if not is_valid_topic_name(name):
        raise _Refused(ErrorCode.INVALID_TOPIC_EXCEPTION, f"invalid topic name {name!r}")
    partitions = topic.num_partitions
    if partitions == -1:
        partitions = backend.auto_create.partitions
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise _Refused(ErrorCode.INVALID_PARTITIONS,
                       f"partition count must be 1..{MAX_PARTITIONS}, got {partitions}")
    if topic.replication_factor not in (1, -1):
        raise _Refused(ErrorCode.INVALID_REPLICATION_FACTOR,
                       f"replication factor must be 1 (one broker), got "
                       f"{topic.replication_factor}")
    if topic.assignments:
        raise _Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                       "replica assignments are not supported (one broker)")
    text = tank_config(topic.configs)
    configs = backend.topic_configs()
    if configs is not None:  # the store's reason, before trying
        try:
            configs.defaults.with_text(text, configs.bounds)
        except InvalidConfig as exc:
            raise _Refused(ErrorCode.INVALID_CONFIG, str(exc)) from None
    return partitions, text


async def _create_one(backend: Backend, topic: CreatableTopic, validate_only: bool,
                      access: ConnectionAccess) -> CreatableTopicResult:
    name = topic.name
    if not access.may(name, Operation.CREATE):
        access.refused(name, Operation.CREATE, "create_topics", "topic_authorization_failed")
        return CreatableTopicResult(name=name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                    error_message="not allowed to create this topic")
    try:
        partitions, text = _check(backend, topic)
    except _Refused as exc:
        return CreatableTopicResult(name=name, error_code=exc.code, error_message=str(exc))
    exists = CreatableTopicResult(name=name, error_code=ErrorCode.TOPIC_ALREADY_EXISTS,
                                  error_message=f"topic {name!r} already exists")
    if validate_only:
        if await backend.discover_partitions(name) is not None:
            return exists
        code = CreateTopicCode.OK
    else:
        code = await backend.create_topic(name, partitions, text)
    if code is CreateTopicCode.EXISTS:
        return exists
    if code is not CreateTopicCode.OK:
        explain = backend.auto_create.explain
        why = explain(name) if explain is not None else None
        error = {CreateTopicCode.BAD_CONFIG: ErrorCode.INVALID_CONFIG,
                 CreateTopicCode.INVALID: ErrorCode.INVALID_REQUEST,
                 CreateTopicCode.READ_ONLY: ErrorCode.POLICY_VIOLATION,
                 }.get(code, ErrorCode.UNKNOWN_SERVER_ERROR if why is None
                       else ErrorCode.KAFKA_STORAGE_ERROR if why.fault
                       else ErrorCode.POLICY_VIOLATION)
        return CreatableTopicResult(name=name, error_code=error, error_message=(
            why.reason if why is not None
            else f"could not create topic {name!r}: {code.name.lower()}"))
    configs = [CreatableTopicConfigs(e.name, e.value, e.read_only, e.config_source,
                                     e.is_sensitive)
               for e in _entries(backend, name, None, planned=text)]
    return CreatableTopicResult(name=name, num_partitions=partitions, replication_factor=1,
                                configs=configs)


async def create_topics(backend: Backend, body: CreateTopicsRequest,
                        access: ConnectionAccess) -> CreateTopicsResponse:
    """The answer to a CreateTopics request: each topic created (or checked) in turn; a
    name given more than once is INVALID_REQUEST for each entry and not created, as
    Kafka answers."""
    names = Counter(topic.name for topic in body.topics)
    return CreateTopicsResponse(topics=[
        CreatableTopicResult(name=topic.name, error_code=ErrorCode.INVALID_REQUEST,
                             error_message=f"topic {topic.name!r} is named "
                             f"{names[topic.name]} times in the request")
        if names[topic.name] > 1 else
        await _create_one(backend, topic, body.validate_only, access)
        for topic in body.topics])


# ----------------------------------------------------------------------- DescribeConfigs

def _ms(secs: int, zero: int = -1) -> int:
    return zero if secs == 0 else secs * 1000


#: Each described key and how to read it from a TopicConfig (Kafka's names where Kafka
#: has the setting; Tank's key otherwise).
_DESCRIBED: Final[list[tuple[str, Callable[[TopicConfig], object]]]] = [
    ("segment.bytes", lambda c: c.segment_bytes),
    ("retention.ms", lambda c: _ms(c.retention_secs)),
    ("retention.bytes", lambda c: c.retention_bytes or -1),
    ("segment.ms", lambda c: _ms(c.roll_secs)),
    ("segment.jitter.ms", lambda c: c.roll_jitter_secs * 1000),
    ("segment.index.bytes", lambda c: c.index_max_bytes),
    ("index.interval.bytes", lambda c: c.index_interval_bytes),
    ("flush.messages", lambda c: c.flush_messages or _LONG_MAX),
    ("flush.ms", lambda c: _ms(c.flush_secs, _LONG_MAX)),
    ("cleanup.policy", lambda c: "compact" if c.cleanup_policy == "cleanup" else "delete"),
    ("min.cleanable.dirty.ratio", lambda c: c.cleaner_min_ratio),
    ("retention.segments.count", lambda c: c.retention_segments),
]


def _topic_config(backend: Backend, name: str, planned: str | None) -> tuple[
        TopicConfig, TopicConfig] | None:
    """(the topic's config, the store's default) when the backend can tell."""
    configs = backend.topic_configs()
    if configs is None:
        return None
    defaults = configs.defaults
    if planned is not None:
        return defaults.with_text(planned), defaults
    config = configs.of(name)
    return (config, defaults) if config is not None else None


def _entries(backend: Backend, name: str, keys: list[str] | None, *,
             planned: str | None = None) -> list[DescribeConfigsResourceResult]:
    found = _topic_config(backend, name, planned)
    if found is None:
        return []
    config, defaults = found
    builtin = TopicConfig()
    entries = []
    for key, read in _DESCRIBED:
        if keys is not None and key not in keys:
            continue
        value = read(config)
        source = (_DEFAULT_CONFIG if value == read(builtin) and value == read(defaults)
                  else _STATIC_BROKER_CONFIG if value == read(defaults) else _TOPIC_CONFIG)
        entries.append(DescribeConfigsResourceResult(
            name=key, value=str(value), read_only=True, config_source=source))
    return entries


async def describe_configs(backend: Backend, body: DescribeConfigsRequest,
                           access: ConnectionAccess) -> DescribeConfigsResponse:
    """The answer to a DescribeConfigs request (topics only)."""
    results = []
    for resource in body.resources:
        name = resource.resource_name
        kind = resource.resource_type

        def result(code: int, message: str | None = None,
                   entries: list[DescribeConfigsResourceResult] | None = None,
                   name: str = name, kind: int = kind) -> DescribeConfigsResult:
            return DescribeConfigsResult(error_code=code, error_message=message,
                                         resource_type=kind, resource_name=name,
                                         configs=entries or [])

        if kind != ResourceType.TOPIC:
            results.append(result(ErrorCode.INVALID_REQUEST,
                                  "only topic configs are described here"))
        elif not access.may_see(name):
            access.refused(name, "discover", "describe_configs", "topic_authorization_failed")
            results.append(result(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                  "not allowed to see this topic"))
        elif await backend.discover_partitions(name) is None:
            results.append(result(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                  f"unknown topic {name!r}"))
        else:
            keys = resource.configuration_keys
            results.append(result(ErrorCode.NONE, None, _entries(
                backend, name, list(keys) if keys is not None else None)))
    return DescribeConfigsResponse(results=results)
