"""``figtank groups list|describe|reset``: Kafka consumer groups' committed offsets, over
the Kafka protocol (so the same in embedded and bridge modes).

``reset`` follows ``kafka-consumer-groups --reset-offsets``: a dry run by default that
prints the plan, applied with ``--execute``; refused while the group has active members.
An offset out of the partition's bounds is moved to the nearest bound (and said so).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gateway.cli.clients import common_options, run_async
from gateway.cli.output import Output, plural
from gateway.client.errors import ClientError
from gateway.client.kafka_admin import (
    EARLIEST,
    LATEST,
    GroupDescription,
    KafkaAdminClient,
    open_kafka_admin,
)
from protocols.kafka.types import ErrorCode
from protocols.topics import MAX_PARTITIONS, is_valid_topic_name

#: What a commit refused because of members is told.
_ACTIVE = {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION,
           ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.FENCED_INSTANCE_ID}


def _topic_spec(text: str) -> tuple[str, int | None]:
    """``TOPIC`` (every partition) or ``TOPIC/P``."""
    name, sep, part = text.partition("/")
    if not is_valid_topic_name(name):
        raise argparse.ArgumentTypeError(f"invalid topic name {name!r}")
    if not sep:
        return name, None
    if not part.isdigit() or int(part) >= MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"bad partition in {text!r}")
    return name, int(part)


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_groups(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "kafka")
    action = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = action.add_parser("list", help="the groups the server knows of")
    describe = action.add_parser(
        "describe", help="a group's committed offsets, log ends, lag and members")
    describe.add_argument("group")
    reset = action.add_parser("reset", help="set a group's committed offsets (dry run "
                                            "unless --execute)")
    reset.add_argument("group")
    reset.add_argument("--topic", type=_topic_spec, required=True, metavar="TOPIC[/P]",
                       help="the topic (every partition) or one partition")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the first available")
    to.add_argument("--to-latest", action="store_true", help="the log end")
    to.add_argument("--to-offset", type=_offset, metavar="N", help="offset N")
    to.add_argument("--to-timestamp", type=_offset, metavar="MS",
                    help="the first message at or after MS (ms since the epoch)")
    reset.add_argument("--execute", action="store_true",
                       help="apply the plan (default: only print it)")
    for each in (listing, describe, reset):
        common_options(each, "kafka", nested=True)


async def groups(args: argparse.Namespace, out: Output) -> None:
    async with open_kafka_admin(*args.address, timeout=args.timeout,
                                ssl_context=args.ssl_context) as admin:
        if args.action == "list":
            await _list(admin, out)
        elif args.action == "describe":
            await _describe(admin, args.group, out)
        else:
            await _reset(admin, args, out)


async def _list(admin: KafkaAdminClient, out: Output) -> None:
    found = await admin.list_groups()
    if found is None:
        raise ClientError("the server does not list groups (no ListGroups); "
                          "'figtank groups describe GROUP' still shows one's offsets")
    for group in found:
        out.record(group, group=group)


async def _describe(admin: KafkaAdminClient, group: str, out: Output) -> None:
    described = await admin.describe_group(group)
    committed = await admin.committed(group)
    if not committed and (described is None or described.state == "Dead"):
        raise ClientError(f"unknown group {group!r} (no committed offsets, no members)")
    owners = _owners(described)
    topics = sorted({t for t, _ in committed} | {t for t, _ in owners})
    if not out.as_json:
        state = f" ({described.state}, {plural(len(described.members), 'member')})" \
            if described is not None else ""
        out.note(f"group {group}{state}")
        print("TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tMEMBER", flush=True)
    for topic in topics:
        parts = sorted({p for t, p in committed if t == topic}
                       | {p for t, p in owners if t == topic})
        try:
            ends = await admin.list_offsets(topic, parts, LATEST)
        except ClientError:
            ends = {}
        for p in parts:
            offset = committed.get((topic, p), (-1, None))[0]
            end = ends.get(p)
            lag = max(end - offset, 0) if end is not None and offset >= 0 else None
            member = owners.get((topic, p))
            out.record("\t".join(str(v) if v is not None else "-" for v in (
                topic, p, offset if offset >= 0 else None, end, lag, member)),
                group=group, topic=topic, partition=p,
                committed=offset if offset >= 0 else None, log_end=end, lag=lag,
                member=member)


def _owners(described: GroupDescription | None) -> dict[tuple[str, int], str]:
    """Which member is assigned each partition (the hook the coordinator fills)."""
    if described is None:
        return {}
    return {tp: m.member_id for m in described.members for tp in m.assignment}


async def _reset(admin: KafkaAdminClient, args: argparse.Namespace, out: Output) -> None:
    group = args.group
    described = await admin.describe_group(group)
    if described is not None and described.active:
        raise ClientError(f"group {group!r} has active members "
                          f"({plural(len(described.members), 'member')}, "
                          f"{described.state}): stop its consumers first")
    topic, only = args.topic
    count = await admin.partitions(topic)
    if count is None:
        raise ClientError(f"unknown topic {topic!r}")
    if only is not None and only >= count:
        raise ClientError(f"{topic} has {plural(count, 'partition')}, no partition {only}")
    parts = [only] if only is not None else list(range(count))
    first = await admin.list_offsets(topic, parts, EARLIEST)
    end = await admin.list_offsets(topic, parts, LATEST)
    current = await admin.committed(group, [(topic, parts)])
    target = await _targets(admin, args, topic, parts, first, end, out)
    if not out.as_json:
        print("TOPIC\tPARTITION\tCOMMITTED\tNEW", flush=True)
    for p in parts:
        now = current.get((topic, p), (-1, None))[0]
        out.record(f"{topic}\t{p}\t{now if now >= 0 else '-'}\t{target[p]}", group=group,
                   topic=topic, partition=p, committed=now if now >= 0 else None,
                   new=target[p], executed=args.execute)
    if not args.execute:
        out.note("dry run: nothing changed (add --execute to apply)")
        return
    codes = await admin.commit(group, {(topic, p): target[p] for p in parts})
    refused = {k: c for k, c in codes.items() if c}
    if refused and set(refused.values()) & _ACTIVE:
        raise ClientError(f"group {group!r} has active members: stop its consumers first")
    if refused:
        (t, p), code = next(iter(sorted(refused.items())))
        raise ClientError(f"reset of {t}/{p} refused: {_name(code)}")
    out.note(f"reset {plural(len(parts), 'partition')} of group {group}")


async def _targets(admin: KafkaAdminClient, args: argparse.Namespace, topic: str,
                   parts: list[int], first: dict[int, int], end: dict[int, int],
                   out: Output) -> dict[int, int]:
    if args.to_earliest:
        return dict(first)
    if args.to_latest:
        return dict(end)
    if args.to_timestamp is not None:
        at = await admin.list_offsets(topic, parts, args.to_timestamp)
        return {p: end[p] if at[p] < 0 else at[p] for p in parts}
    target = {}
    for p in parts:
        wanted = args.to_offset
        target[p] = min(max(wanted, first[p]), end[p])
        if target[p] != wanted:
            out.note(f"{topic}/{p}: offset {wanted} is outside {first[p]}..{end[p]}: "
                     f"{target[p]} instead")
    return target


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


#: ``figtank groups``: (add arguments, run).
COMMAND: tuple[Callable[[argparse.ArgumentParser], None],
              Callable[[argparse.Namespace], int]] = (add_groups, run_async(groups))
