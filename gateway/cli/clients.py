"""Client subcommands of ``figtank`` for people at a terminal (and, with --json, programs).

Figg: ``publish``, ``subscribe``. Tank: ``produce``, ``consume``, ``topics``, ``status``.
Kafka: ``fetch``, ``groups`` (:mod:`gateway.cli.groups`).
Files: ``inspect``. Results go to stdout, one record a line (see :mod:`gateway.cli.output`);
notes, log lines and errors go to stderr. A failure is one line,
``figtank COMMAND: what failed``, and exit status 1 (2 for usage mistakes).
"""

from __future__ import annotations

import argparse
import itertools
import math
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import trio

from gateway.cli.output import Output, escaped, json_payload, plural
from gateway.client.errors import ClientError, RequestTimeout
from gateway.client.figg import ExponentialBackoff, FiggClient, open_figg_client
from gateway.client.tank import FIRST_AVAILABLE, TankClient, open_tank_client
from gateway.client.tls import client_context
from gateway.core.config import parse_address
from gateway.core.logs import configure_logging
from gateway.figg.offsets import InvalidTopic, figg_to_tank
from gateway.io.tls import readable
from gateway.store.config import CONFIG_KEYS, parse_value
from gateway.store.errors import InvalidConfig
from protocols.errors import ProtocolError
from protocols.tank.bundle import Message
from protocols.topics import MAX_PARTITIONS

Run = Callable[[argparse.Namespace], int]

#: Seconds a command waits for a server to connect or to answer, unless --timeout.
DEFAULT_TIMEOUT = 10.0
#: Connection attempts a Figg command makes before it reports the server unreachable.
FIGG_CONNECT_ATTEMPTS = 3
#: Where each protocol's commands connect, unless told.
DEFAULT_ENDPOINTS = {"figg": "127.0.0.1:8119", "tank": "127.0.0.1:11011",
                     "kafka": "127.0.0.1:9092"}
#: Messages read from stdin and sent as one Produce.
STDIN_BATCH = 1024
#: How long one Consume waits for new messages with --follow (ms).
FOLLOW_WAIT_MS = 5000

# -- argument types --------------------------------------------------------------------------


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _figg_topic(text: str) -> str:
    try:
        figg_to_tank(text)
    except InvalidTopic as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _topic_partition(text: str) -> tuple[str, int]:
    try:
        where = figg_to_tank(text)
    except InvalidTopic as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return where.topic, where.partition


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _partitions(text: str) -> int:
    value = _positive(text)
    if value > MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"a topic has at most {MAX_PARTITIONS} partitions")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _tank_config(text: str) -> str:
    key, sep, value = text.partition("=")
    key, value = key.strip().lower(), value.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key not in CONFIG_KEYS:
        raise argparse.ArgumentTypeError(f"unknown Tank config key {key!r} "
                                         f"(known: {', '.join(CONFIG_KEYS)})")
    try:
        parse_value(key, value)
    except InvalidConfig as exc:
        raise argparse.ArgumentTypeError(f"bad value {value!r} for {key}: {exc}") from None
    return f"{key}={value}"


# -- options every client command takes ------------------------------------------------------


def common_options(parser: argparse.ArgumentParser, protocol: str, *, nested: bool = False,
            key_flags: tuple[str, ...] = ("--key", "--tls-key")) -> None:
    """The endpoint, output and logging options.

    ``nested`` adds them to an action of ``topics`` as well, so that they may follow
    the action; there they leave the value given before the action alone.
    """
    default = DEFAULT_ENDPOINTS[protocol]

    def given(value: object) -> object:
        return argparse.SUPPRESS if nested else value

    parser.add_argument(f"--{protocol}", dest="address", type=_address,
                        default=given(_address(default)), metavar="HOST:PORT",
                        help=f"{protocol.title()} endpoint [{default}]")
    parser.add_argument("--json", action="store_true", default=given(False),
                        help="one JSON object a line (payloads: UTF-8 text, else null and "
                             "FIELD_base64)")
    parser.add_argument("--timeout", type=_seconds, default=given(DEFAULT_TIMEOUT),
                        metavar="SECONDS",
                        help=f"give up when the server does not connect or answer for this "
                             f"long [{DEFAULT_TIMEOUT:g}]")
    _tls_options(parser, key_flags, nested=nested)
    _logging_options(parser, nested=nested)


def _tls_options(parser: argparse.ArgumentParser, key_flags: tuple[str, ...], *,
                 nested: bool = False) -> None:
    def given(value: object) -> object:
        return argparse.SUPPRESS if nested else value

    parser.add_argument("--tls", action="store_true", default=given(False),
                        help="connect over TLS, verifying the server against the system's "
                             "CAs (--ca, --cert imply --tls)")
    parser.add_argument("--ca", default=given(None), metavar="FILE",
                        help="CA certificates (PEM) to verify the server with")
    parser.add_argument("--cert", default=given(None), metavar="FILE",
                        help="client certificate chain (PEM), for a mutual-TLS listener")
    parser.add_argument(*key_flags, dest="tls_key", default=given(None), metavar="FILE",
                        help="private key (PEM) of --cert (default: in the --cert file)")


def _key_flag(args: argparse.Namespace) -> str:
    return "--tls-key" if args.command == "produce" else "--key"


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context the ``--tls``, ``--ca``, ``--cert`` and ``--key`` options ask for
    (None: plain TCP); ``ValueError`` names the option whose file does not load."""
    ca, cert, key = (getattr(args, name, None) for name in ("ca", "cert", "tls_key"))
    if not (getattr(args, "tls", False) or ca or cert or key):
        return None
    if key and not cert:
        raise ValueError(f"argument {_key_flag(args)}: needs --cert")
    for option, path in (("--ca", ca), ("--cert", cert), (_key_flag(args), key)):
        try:
            readable(path)
        except ValueError as exc:
            raise ValueError(f"argument {option}: {exc}") from None
    try:
        return client_context(ca=ca, cert=cert, key=key)
    except ValueError as exc:
        option = "--ca" if "the CA" in str(exc) else "--cert"
        raise ValueError(f"argument {option}: {exc}") from None


def _logging_options(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    parser.add_argument("-v", "--verbose", action="count",
                        default=argparse.SUPPRESS if nested else 0,
                        help="log more on stderr (-v info, -vv debug)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        default=argparse.SUPPRESS if nested else None,
                        help="log level on stderr [warning]; debug also shows tracebacks")


def configure_client_logging(args: argparse.Namespace) -> None:
    """Logs on stderr, at ``warning`` unless ``-v`` or ``--log-level`` ask for more."""
    level = args.log_level or ("warning", "info", "debug")[min(args.verbose, 2)]
    args.log_level = level
    configure_logging(level, "auto")


def _failed(command: str, reason: object) -> int:
    """Report a runtime failure as its one line; returns the exit status (1)."""
    print(f"figtank {command}: {reason}", file=sys.stderr, flush=True)
    return 1


def run_async(fn: Callable[[argparse.Namespace, Output], Awaitable[object]]) -> Run:
    def run(args: argparse.Namespace) -> int:
        configure_client_logging(args)
        try:
            args.ssl_context = tls_context(args)
        except ValueError as exc:
            print(f"figtank {args.command}: {exc} (see 'figtank {args.command} --help')",
                  file=sys.stderr, flush=True)
            return 2
        out = Output(args.json)
        try:
            trio.run(fn, args, out)
        except (ClientError, OSError, ProtocolError) as exc:
            out.end_progress()
            return _failed(args.command, exc)
        out.end_progress()
        return 0
    return run


@asynccontextmanager
async def _stall_limit(seconds: float, what: Callable[[], str]
                       ) -> AsyncIterator[Callable[[], None]]:
    """Yields ``progress()``; raises RequestTimeout when ``seconds`` pass without a call.

    ``what()`` says what was being waited for.
    """
    with trio.CancelScope(deadline=trio.current_time() + seconds) as scope:
        def progress() -> None:
            scope.deadline = trio.current_time() + seconds
        yield progress
    if scope.cancelled_caught:
        raise RequestTimeout(f"{what()}: no answer for {seconds:g} s")


def _read_lines(stream: BinaryIO) -> Iterator[bytes]:
    """Lines of ``stream`` without their line ending (kcat -P style: one message a line)."""
    for line in stream:
        yield line[:-1] if line.endswith(b"\n") else line


def _payloads(messages: list[str]) -> Iterator[bytes]:
    """The messages given on the command line, or stdin's lines for ``-``."""
    if messages == ["-"]:
        return _read_lines(sys.stdin.buffer)
    return (m.encode() for m in messages)


# -- Figg ------------------------------------------------------------------------------------


@asynccontextmanager
async def _figg_client(args: argparse.Namespace) -> AsyncIterator[FiggClient]:
    host, port = args.address
    async with open_figg_client(
            host, port, connect_timeout=args.timeout, first_connect_attempts=FIGG_CONNECT_ATTEMPTS,
            backoff=ExponentialBackoff(base=0.25, cap=5.0),
            ssl_context=args.ssl_context) as client:
        with trio.move_on_after(args.timeout) as scope:
            await client.wait_connected()
        if scope.cancelled_caught:
            raise RequestTimeout(f"{host}:{port} did not accept a connection within "
                                 f"{args.timeout:g} s")
        yield client


def _add_messages(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("messages", nargs="+", metavar="MESSAGE",
                        help=f"message payloads, or - to {verb} stdin's lines")


def _add_publish(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "figg")
    parser.add_argument("topic", type=_figg_topic, help="Figg topic (name or name/partition)")
    _add_messages(parser, "publish")
    parser.add_argument("--skip", type=_non_negative, default=0, metavar="N",
                        help="skip the first N messages (lines): resume after the N a "
                             "failed run reported acknowledged")


class PublishIncomplete(ClientError):
    """A publish that failed part-way: how many messages (from the first) were
    acknowledged, and how many were sent, counting the skipped ones."""

    def __init__(self, reason: object, acknowledged: int, sent: int) -> None:
        super().__init__(f"{reason}; {acknowledged} of {plural(sent, 'message')} "
                         f"acknowledged; resume after them with --skip {acknowledged}")
        self.acknowledged = acknowledged
        self.sent = sent


async def _publish(args: argparse.Namespace, out: Output) -> None:
    """Publish the messages after ``--skip``; a failure says how many were acknowledged
    (always the first ones: a Figg ACK acknowledges every publish up to it)."""
    acked = published = 0

    def stalled() -> str:
        hint = ("its log says why" if client.answered
                else f"is {args.address[0]}:{args.address[1]} a Figg server?")
        return f"publish to {args.topic}: no acknowledgement ({hint})"

    try:
        async with _figg_client(args) as client, \
                _stall_limit(args.timeout, stalled) as progress:
            def on_ack(_: int) -> None:
                nonlocal acked
                acked += 1
                progress()

            for data in itertools.islice(_payloads(args.messages), args.skip, None):
                await client.publish(args.topic, data, on_ack)
                published += 1
                out.progress(f"published {published}, acknowledged {acked}")
            await client.wait_all_acked()
    except (ClientError, OSError, ProtocolError) as exc:
        done, sent = args.skip + acked, args.skip + published
        if out.as_json:
            out.record("", topic=args.topic, published=sent, acknowledged=done,
                       complete=False, error=str(exc))
        raise PublishIncomplete(exc, done, sent) from None
    out.record(f"{plural(published, 'message')} published to {args.topic} and acknowledged",
               topic=args.topic, published=published)


def _add_subscribe(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "figg")
    parser.add_argument("topic", type=_figg_topic, help="Figg topic (name or name/partition)")
    parser.add_argument("--from", dest="from_offset", type=_non_negative, default=None,
                        metavar="OFFSET",
                        help="resume after OFFSET (0: from the beginning; omitted: new only)")
    _from_group_options(parser)
    parser.add_argument("--count", type=_positive, default=None,
                        help="stop after this many messages")
    parser.add_argument("--idle", type=_seconds, default=None, metavar="SECONDS",
                        help="stop after this long without a message")


def _from_group_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from-group", default=None, metavar="GROUP",
                        help="start where the Kafka consumer group GROUP is: after the "
                             "last message it committed (asked over --kafka-endpoint)")
    parser.add_argument("--kafka-endpoint", dest="kafka_address", type=_address,
                        default=_address(DEFAULT_ENDPOINTS["kafka"]), metavar="HOST:PORT",
                        help=f"Kafka endpoint --from-group asks "
                             f"[{DEFAULT_ENDPOINTS['kafka']}]")


async def _group_position(args: argparse.Namespace, topic: str, partition: int) -> int:
    """The Tank sequence of the last message ``--from-group`` committed in the partition;
    a ClientError when there is none."""
    if args.from_offset_given:
        raise ClientError("--from and --from-group exclude each other")
    from gateway.client.kafka_admin import group_position  # the Kafka codecs: only here

    host, port = args.kafka_address
    position = await group_position(host, port, args.from_group, topic, partition,
                                    timeout=args.timeout, ssl_context=args.ssl_context)
    if position is None:
        raise ClientError(f"group {args.from_group!r} has no committed offset for "
                          f"{topic}/{partition}")
    return position


async def _subscribe(args: argparse.Namespace, out: Output) -> None:
    if args.from_group is not None:
        where = figg_to_tank(args.topic)
        args.from_offset_given = args.from_offset is not None
        args.from_offset = await _group_position(args, where.topic, where.partition)
    async with _figg_client(args) as client:
        subscription = await client.subscribe(args.topic, from_offset=args.from_offset)
        start = subscription.start_offset
        if args.from_offset is not None and start != args.from_offset:
            out.note(f"{args.topic}: starting after offset {start} "
                     f"(asked for after {args.from_offset})")
        received = 0
        while args.count is None or received < args.count:
            message = None
            with trio.move_on_after(args.idle or math.inf):
                try:
                    message = await subscription.receive()
                except trio.EndOfChannel:
                    return
            if message is None:
                return  # idle for --idle seconds
            out.record(f"{message.offset}\t{escaped(message.data)}", topic=message.topic,
                       offset=message.offset, **json_payload("data", message.data))
            received += 1


# -- Tank ------------------------------------------------------------------------------------


@asynccontextmanager
async def _tank_client(args: argparse.Namespace) -> AsyncIterator[TankClient]:
    async with open_tank_client(*args.address, connect_timeout=args.timeout,
                                request_timeout=args.timeout,
                                ssl_context=args.ssl_context) as client:
        yield client


def _add_produce(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "tank", key_flags=("--tls-key",))  # --key: the message key
    parser.add_argument("target", type=_topic_partition, metavar="TOPIC[/P]")
    _add_messages(parser, "produce")
    parser.add_argument("--key", default=None, help="key for every message")


def _batches(payloads: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for payload in payloads:
        batch.append(payload)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


async def _produce(args: argparse.Namespace, out: Output) -> None:
    topic, partition = args.target
    key = None if args.key is None else args.key.encode()
    produced = 0
    async with _tank_client(args) as client:
        for batch in _batches(_payloads(args.messages), STDIN_BATCH):
            await client.produce({(topic, partition): [Message(m, key=key) for m in batch]})
            produced += len(batch)
            out.progress(f"produced {produced}")
        [bounds] = await client.discover_partitions(topic, [partition])
    out.record(f"{plural(produced, 'message')} produced to {topic}/{partition} "
               f"(high-water mark {bounds.high_water_mark})", topic=topic,
               partition=partition, produced=produced,
               high_water_mark=bounds.high_water_mark)


def _add_consume(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "tank")
    parser.add_argument("target", type=_topic_partition, metavar="TOPIC[/P]")
    parser.add_argument("--from", dest="seq", type=_non_negative, default=FIRST_AVAILABLE,
                        metavar="SEQ", help="first sequence number (default: first available)")
    parser.add_argument("--follow", action="store_true",
                        help="keep waiting for new messages (like tail -f)")
    _from_group_options(parser)
    parser.add_argument("--count", type=_positive, default=None, help="stop after this many")


async def _consume(args: argparse.Namespace, out: Output) -> None:
    topic, partition = args.target
    if args.from_group is not None:
        args.from_offset_given = args.seq != FIRST_AVAILABLE
        args.seq = await _group_position(args, topic, partition) + 1
    seq, shown = args.seq, 0
    async with _tank_client(args) as client:
        while args.count is None or shown < args.count:
            result = await client.consume(topic, partition, seq,
                                          max_wait_ms=FOLLOW_WAIT_MS if args.follow else 0)
            for message in result.messages:
                out.record(f"{message.seq}\t{message.timestamp}\t{escaped(message.key)}\t"
                           f"{escaped(message.value)}", topic=topic, partition=partition,
                           seq=message.seq, timestamp=message.timestamp,
                           **json_payload("key", message.key),
                           **json_payload("value", message.value))
                shown += 1
                if args.count is not None and shown >= args.count:
                    return
            if not result.messages and not args.follow:
                return
            seq = result.next_seq
            if not args.follow:
                out.progress(f"{plural(shown, 'message')}, at {seq - 1} of "
                             f"{result.high_water_mark}")


def _add_fetch(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "kafka")
    parser.add_argument("target", type=_topic_partition, metavar="TOPIC[/P]")
    parser.add_argument("--from", dest="offset", type=_non_negative, default=None,
                        metavar="OFFSET", help="first Kafka offset (default: the earliest)")
    parser.add_argument("--follow", action="store_true",
                        help="keep waiting for new messages (like tail -f)")
    parser.add_argument("--count", type=_positive, default=None, help="stop after this many")


async def _fetch(args: argparse.Namespace, out: Output) -> None:
    """Read a partition over the Kafka listener (Fetch), one record a line: the Kafka
    offset first (the message's Tank sequence minus 1)."""
    from gateway.client.kafka_admin import EARLIEST, open_kafka_admin  # only here

    topic, partition = args.target
    shown = 0
    async with open_kafka_admin(*args.address, timeout=args.timeout,
                                ssl_context=args.ssl_context) as client:
        offset = args.offset
        if offset is None:
            offset = (await client.list_offsets(topic, [partition], EARLIEST))[partition]
        while args.count is None or shown < args.count:
            result = await client.fetch(topic, partition, offset,
                                        max_wait_ms=FOLLOW_WAIT_MS if args.follow else 0)
            for record in result.records[:None if args.count is None else
                                         args.count - shown]:
                out.record(f"{record.offset}\t{record.timestamp}\t{escaped(record.key)}\t"
                           f"{escaped(record.value)}", topic=topic, partition=partition,
                           offset=record.offset, timestamp=record.timestamp,
                           **json_payload("key", record.key),
                           **json_payload("value", record.value))
                shown += 1
            if result.records:
                offset = result.records[-1].offset + 1
            elif not args.follow:
                out.progress(f"{plural(shown, 'message')}, at offset {offset} of "
                             f"{result.high_watermark}")
                return


def _add_topics(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "tank")
    action = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = action.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=_partitions, default=1)
    create.add_argument("--config", type=_tank_config, action="append", default=[],
                        metavar="KEY=VALUE", help="Tank config key for the topic (repeatable)")
    listing = action.add_parser("list", help="list topics")
    describe = action.add_parser("describe", help="partitions and their sequence bounds")
    describe.add_argument("name")
    for each in (create, listing, describe):
        common_options(each, "tank", nested=True)


async def _topics(args: argparse.Namespace, out: Output) -> None:
    async with _tank_client(args) as client:
        if args.action == "create":
            await client.create_topic(args.name, args.partitions, "\n".join(args.config))
            out.record(f"created {args.name} with {plural(args.partitions, 'partition')}",
                       topic=args.name, partitions=args.partitions)
        elif args.action == "list":
            for topic in await client.discover_topics():
                out.record(f"{topic.name}\t{plural(topic.partitions, 'partition')}",
                           topic=topic.name, partitions=topic.partitions)
        else:
            for bounds in await client.discover_partitions(args.name):
                out.record(f"{args.name}/{bounds.partition}\tfirst {bounds.first_available}"
                           f"\thigh-water mark {bounds.high_water_mark}", topic=args.name,
                           partition=bounds.partition, first_available=bounds.first_available,
                           high_water_mark=bounds.high_water_mark)


def _add_status(parser: argparse.ArgumentParser) -> None:
    common_options(parser, "tank")


async def _status(args: argparse.Namespace, out: Output) -> None:
    async with _tank_client(args) as client:
        status = await client.status()
    out.record(f"{plural(status.topics, 'topic')}, {plural(status.partitions, 'partition')} "
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
    _logging_options(parser)


def _not_a_partition(directory: str) -> str:
    """The error for a directory without segment files, naming partitions below it."""
    below = sorted({str(path.parent) for pattern in ("*/*.log", "*/*/*.log")
                    for path in Path(directory).glob(pattern)})
    hint = f" such as {', '.join(below[:3])}" if below else ""
    return (f"{directory} holds no segment files: give a partition directory "
            f"(DATA_DIR/TOPIC/PARTITION){hint}")


def _inspect(args: argparse.Namespace) -> int:
    from gateway.store.inspect import check_rolled, iter_messages, list_segments

    configure_client_logging(args)
    out = Output(args.json)
    try:
        segments = list_segments(args.directory)
    except OSError as exc:
        return _failed("inspect", f"{args.directory}: {exc.strerror or exc}")
    if not segments:
        return _failed("inspect", _not_a_partition(args.directory))
    status = 0
    for segment in segments:
        out.record(f"# {segment.name}: base {segment.base_seq}, {segment.size} bytes, "
                   f"{plural(len(segment.index_entries), 'index entry', 'index entries')}",
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
            check = check_rolled(args.directory, segment)
        except OSError as exc:
            status = _failed("inspect", f"{segment.name}: {exc.strerror or exc}")
            continue
        for damage in check.damage if check is not None else ():
            lost = ("no message lost" if damage.first_lost is None else
                    f"sequences {damage.first_lost}-{damage.last_lost} lost")
            out.record(f"# damage in {segment.name} at offset {damage.offset}: "
                       f"{damage.size} bytes, {lost}: {damage.reason}",
                       kind="damage", segment=segment.name, offset=damage.offset,
                       bytes=damage.size, first_seq=damage.first_lost,
                       last_seq=damage.last_lost, reason=damage.reason)
        try:
            for m in iter_messages(args.directory, segment, show_progress,
                                   None if check is None else check.extents):
                out.record(f"{m.seq}\t{m.timestamp}\t{escaped(m.key)}\t{m.size}",
                           kind="message", segment=m.segment, offset=m.offset, seq=m.seq,
                           timestamp=m.timestamp, **json_payload("key", m.key), size=m.size)
        except ProtocolError as exc:
            out.end_progress()
            status = _failed("inspect", str(exc))
        out.end_progress()
        if check is not None and check.damage:
            status = _failed("inspect", f"{segment.name}: "
                             f"{plural(len(check.damage), 'damaged region')} (skipped)")
    return status


#: Each client subcommand's (add arguments, run); their help lines are
#: :data:`gateway.cli.main.COMMAND_HELP`'s (this module is loaded only when one runs).
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Run]] = {
    "publish": (_add_publish, run_async(_publish)),
    "subscribe": (_add_subscribe, run_async(_subscribe)),
    "produce": (_add_produce, run_async(_produce)),
    "consume": (_add_consume, run_async(_consume)),
    "fetch": (_add_fetch, run_async(_fetch)),
    "topics": (_add_topics, run_async(_topics)),
    "status": (_add_status, run_async(_status)),
    "inspect": (_add_inspect, _inspect),
}
