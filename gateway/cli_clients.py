"""Client subcommands of ``figtank`` for people at a terminal (and, with --json, programs).

Figg: ``publish``, ``subscribe``. Tank: ``produce``, ``consume``, ``topics``, ``status``.
Files: ``inspect``. Results go to stdout; progress and errors to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from gateway.client.errors import ClientError, ConnectError
from gateway.client.figg import open_figg_client
from gateway.client.tank import FIRST_AVAILABLE, open_tank_client
from gateway.config import parse_address
from gateway.inspect import iter_messages, list_segments
from gateway.offsets import InvalidTopic, figg_to_tank
from protocols.errors import ProtocolError
from protocols.tank.bundle import Message

Run = Callable[[argparse.Namespace], int]


class Output:
    """Writes results for a person, or one JSON object a line with ``--json``."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._progress_shown = False

    def record(self, text: str, **fields: Any) -> None:
        if self.as_json:
            print(json.dumps(fields), flush=True)
        else:
            print(text, flush=True)

    def progress(self, text: str) -> None:
        """A progress line on stderr, rewritten in place, only on a terminal."""
        if sys.stderr.isatty():
            print(f"\r{text}", end="", file=sys.stderr, flush=True)
            self._progress_shown = True

    def end_progress(self) -> None:
        if self._progress_shown:
            print(file=sys.stderr)
            self._progress_shown = False


def _text(data: bytes | None) -> str | None:
    """Bytes shown as text when they are UTF-8, else as hex."""
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "0x" + data.hex()


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _topic_partition(text: str) -> tuple[str, int]:
    try:
        where = figg_to_tank(text)
    except InvalidTopic as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return where.topic, where.partition


def _common(parser: argparse.ArgumentParser, protocol: str) -> None:
    default = "127.0.0.1:8119" if protocol == "figg" else "127.0.0.1:11011"
    parser.add_argument(f"--{protocol}", dest="address", type=_address, default=default,
                        metavar="HOST:PORT", help=f"{protocol.title()} endpoint [{default}]")
    parser.add_argument("--json", action="store_true", help="one JSON object a line")


#: How long a Figg subcommand waits for the server before giving up (the Figg client
#: itself reconnects forever, which suits programs, not a person at a terminal).
FIGG_CONNECT_TIMEOUT = 10.0


@asynccontextmanager
async def _figg_client(address: tuple[str, int]) -> AsyncIterator[Any]:
    async with open_figg_client(*address) as client:
        with trio.move_on_after(FIGG_CONNECT_TIMEOUT) as scope:
            await client.wait_connected()
        if scope.cancelled_caught:
            raise ConnectError(f"no Figg server answered at {address[0]}:{address[1]}")
        yield client


def _run_async(fn: Callable[[argparse.Namespace, Output], Any]) -> Run:
    def run(args: argparse.Namespace) -> int:
        out = Output(args.json)
        try:
            result = trio.run(fn, args, out)
        except (ClientError, OSError, ProtocolError) as exc:
            out.end_progress()
            print(f"figtank: {exc}", file=sys.stderr)
            return 1
        out.end_progress()
        return 0 if result is None else int(result)
    return run


# -- Figg ------------------------------------------------------------------------------------

def _add_publish(parser: argparse.ArgumentParser) -> None:
    _common(parser, "figg")
    parser.add_argument("topic", help="Figg topic (name or name/partition)")
    parser.add_argument("messages", nargs="+", help="message payloads")


async def _publish(args: argparse.Namespace, out: Output) -> None:
    async with _figg_client(args.address) as client:
        for i, text in enumerate(args.messages, 1):
            await client.publish(args.topic, text.encode())
            out.progress(f"published {i}/{len(args.messages)}")
        await client.wait_all_acked()
    out.end_progress()
    out.record(f"{len(args.messages)} messages published to {args.topic} and acknowledged",
               topic=args.topic, published=len(args.messages))


def _add_subscribe(parser: argparse.ArgumentParser) -> None:
    _common(parser, "figg")
    parser.add_argument("topic", help="Figg topic (name or name/partition)")
    parser.add_argument("--from", dest="from_offset", type=int, default=None,
                        metavar="OFFSET",
                        help="resume after OFFSET (0: from the beginning; omitted: new only)")
    parser.add_argument("--count", type=int, default=None,
                        help="stop after this many messages")


async def _subscribe(args: argparse.Namespace, out: Output) -> None:
    async with _figg_client(args.address) as client:
        subscription = await client.subscribe(args.topic, from_offset=args.from_offset)
        received = 0
        if args.count == 0:
            return
        async for message in subscription:
            out.record(f"{message.offset}\t{_text(message.data)}", topic=message.topic,
                       offset=message.offset, data=_text(message.data))
            received += 1
            if args.count is not None and received >= args.count:
                break


# -- Tank ------------------------------------------------------------------------------------

def _add_produce(parser: argparse.ArgumentParser) -> None:
    _common(parser, "tank")
    parser.add_argument("target", type=_topic_partition, metavar="TOPIC[/P]")
    parser.add_argument("messages", nargs="+", help="message payloads")
    parser.add_argument("--key", default=None, help="key for every message")


async def _produce(args: argparse.Namespace, out: Output) -> None:
    topic, partition = args.target
    key = None if args.key is None else args.key.encode()
    async with open_tank_client(*args.address) as client:
        await client.produce({(topic, partition): [Message(m.encode(), key=key)
                                                   for m in args.messages]})
        [bounds] = await client.discover_partitions(topic, [partition])
    out.record(f"{len(args.messages)} messages produced to {topic}/{partition} "
               f"(high-water mark {bounds.high_water_mark})", topic=topic,
               partition=partition, produced=len(args.messages),
               high_water_mark=bounds.high_water_mark)


def _add_consume(parser: argparse.ArgumentParser) -> None:
    _common(parser, "tank")
    parser.add_argument("target", type=_topic_partition, metavar="TOPIC[/P]")
    parser.add_argument("--from", dest="seq", type=int, default=FIRST_AVAILABLE,
                        metavar="SEQ", help="first sequence number (default: first available)")
    parser.add_argument("--follow", action="store_true",
                        help="keep waiting for new messages (like tail -f)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many")


async def _consume(args: argparse.Namespace, out: Output) -> None:
    topic, partition = args.target
    seq, shown = args.seq, 0
    async with open_tank_client(*args.address) as client:
        while args.count is None or shown < args.count:
            result = await client.consume(topic, partition, seq,
                                          max_wait_ms=5000 if args.follow else 0)
            for message in result.messages:
                out.record(f"{message.seq}\t{message.timestamp}\t{_text(message.key) or ''}\t"
                           f"{_text(message.value)}", topic=topic, partition=partition,
                           seq=message.seq, timestamp=message.timestamp,
                           key=_text(message.key), value=_text(message.value))
                shown += 1
                if args.count is not None and shown >= args.count:
                    return
            if not result.messages and not args.follow:
                return
            seq = result.next_seq
            if not args.follow:
                out.progress(f"{shown} messages, at {seq - 1} of {result.high_water_mark}")


def _add_topics(parser: argparse.ArgumentParser) -> None:
    _common(parser, "tank")
    action = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = action.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="Tank config key for the topic (repeatable)")
    action.add_parser("list", help="list topics")
    describe = action.add_parser("describe", help="partitions and their sequence bounds")
    describe.add_argument("name")


async def _topics(args: argparse.Namespace, out: Output) -> None:
    async with open_tank_client(*args.address) as client:
        if args.action == "create":
            await client.create_topic(args.name, args.partitions, "\n".join(args.config))
            out.record(f"created {args.name} with {args.partitions} partitions",
                       topic=args.name, partitions=args.partitions)
        elif args.action == "list":
            for topic in await client.discover_topics():
                out.record(f"{topic.name}\t{topic.partitions} partitions", topic=topic.name,
                           partitions=topic.partitions)
        else:
            for bounds in await client.discover_partitions(args.name):
                out.record(f"{args.name}/{bounds.partition}\tfirst {bounds.first_available}"
                           f"\thigh-water mark {bounds.high_water_mark}", topic=args.name,
                           partition=bounds.partition, first_available=bounds.first_available,
                           high_water_mark=bounds.high_water_mark)


def _add_status(parser: argparse.ArgumentParser) -> None:
    _common(parser, "tank")


async def _status(args: argparse.Namespace, out: Output) -> None:
    async with open_tank_client(*args.address) as client:
        status = await client.status()
    out.record(f"topics {status.topics}, partitions {status.partitions} "
               f"({status.open_partitions} open), up {status.open_time_ms / 1000:.1f} s, "
               f"version {status.version}", topics=status.topics,
               partitions=status.partitions, open_partitions=status.open_partitions,
               open_time_ms=status.open_time_ms, startup_ts=status.startup_ts,
               version=status.version)


# -- files -----------------------------------------------------------------------------------

def _add_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DATA_DIR/TOPIC/P",
                        help="a partition directory")
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.add_argument("--index", action="store_true", help="also list the index entries")


def _inspect(args: argparse.Namespace) -> int:
    out = Output(args.json)
    try:
        segments = list_segments(args.directory)
    except OSError as exc:
        print(f"figtank: {exc}", file=sys.stderr)
        return 1
    status = 0
    for segment in segments:
        out.record(f"# {segment.name}: base {segment.base_seq}, {segment.size} bytes, "
                   f"{len(segment.index_entries)} index entries",
                   kind="segment", segment=segment.name, base_seq=segment.base_seq,
                   last_seq=segment.last_seq, rolled=segment.rolled, size=segment.size,
                   index_entries=len(segment.index_entries))
        if args.index:
            for rel, offset in segment.index_entries:
                out.record(f"  index seq {segment.base_seq + rel} -> offset {offset}",
                           kind="index", segment=segment.name, seq=segment.base_seq + rel,
                           offset=offset)
        def show_progress(done: int, total: int, name: str = segment.name) -> None:
            out.progress(f"{name}: {done * 100 // max(total, 1)}%")

        try:
            for m in iter_messages(args.directory, segment, show_progress):
                out.record(f"{m.seq}\t{m.timestamp}\t{_text(m.key) or ''}\t{m.size}",
                           kind="message", segment=m.segment, offset=m.offset, seq=m.seq,
                           timestamp=m.timestamp, key=_text(m.key), size=m.size)
        except ProtocolError as exc:
            out.end_progress()
            print(f"figtank: {exc}", file=sys.stderr)
            status = 1
        out.end_progress()
    return status


COMMANDS: dict[str, tuple[str, tuple[Callable[[argparse.ArgumentParser], None], Run]]] = {
    "publish": ("publish messages over Figg", (_add_publish, _run_async(_publish))),
    "subscribe": ("print a Figg topic's messages", (_add_subscribe, _run_async(_subscribe))),
    "produce": ("produce messages over Tank", (_add_produce, _run_async(_produce))),
    "consume": ("print a Tank partition's messages", (_add_consume, _run_async(_consume))),
    "topics": ("create, list or describe topics (Tank)", (_add_topics, _run_async(_topics))),
    "status": ("the broker's status (Tank)", (_add_status, _run_async(_status))),
    "inspect": ("dump a partition's segment and index files", (_add_inspect, _inspect)),
}
