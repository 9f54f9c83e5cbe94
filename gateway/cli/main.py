"""The ``figtank`` command: ``serve`` runs the gateway; the other subcommands are clients."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

import trio

from gateway.cli.output import StdoutClosed
from gateway.core.config import (
    ConfigError,
    Settings,
    add_setting_flags,
    flag_overrides,
    load_settings,
)
from gateway.core.logs import configure_logging
from gateway.extras import MissingExtra
from gateway.server.outcome import describe, leaves, run_serving

if TYPE_CHECKING:
    from gateway.server.run import ServerInfo

#: Subcommand name -> (function that adds its arguments, function that runs it).
Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML config file (flags override it)")
    # Checked by _run_serve, so a bad value is one configuration error line.
    parser.add_argument("--grace", default="2", metavar="SECONDS",
                        help="seconds open connections get to finish what is in flight at "
                             "shutdown (a second SIGINT/SIGTERM cuts it short) [2]")
    add_setting_flags(parser)


def _run_serve(args: argparse.Namespace) -> int:
    """``figtank serve``: 0 after a signal-initiated shutdown; a setting that is wrong or
    that the machine refuses (a port in use, an unusable data directory) raises
    ConfigError (exit 2); any other failure is one line and exit 1. Tracebacks
    only with ``--log-level debug``. ``--workers N`` (N > 1) runs the supervisor of N
    worker processes (:mod:`gateway.server.workers`)."""
    grace = _grace_secs(args.grace)
    settings = settings_from_args(args)
    configure_logging(settings.log_level, settings.log_format)
    announce = _announce if sys.stderr.isatty() else None
    serve: Callable[[], Awaitable[int | None]]
    if settings.workers > 1:
        from gateway.server.workers import supervise

        serve = partial(supervise, settings, grace=grace, on_serving=announce)
    else:
        from gateway.server.run import serve_until_signalled

        serve = partial(serve_until_signalled, settings, grace=grace, on_serving=announce)
    return run_serving(serve, settings)


def _announce(info: ServerInfo) -> None:
    """Where the server listens, in one plain line for a person at a terminal (the
    ``figtank_serving`` log line has it for programs): the protocol listeners first
    (Figg, Tank, Kafka, then named ones), metrics last."""
    print(serving_line(info), file=sys.stderr)


def serving_line(info: ServerInfo) -> str:
    """The line :func:`_announce` prints: the listeners named after their protocol
    first, in the order and with the names of the table of listeners."""
    from gateway.server.listeners import LISTENERS  # serving only: client commands skip it

    shown = {kind.name: kind.shown for kind in LISTENERS}
    order = {name: i for i, name in enumerate(shown)}
    names = sorted(info.addresses, key=lambda n: (n == "metrics", order.get(n, len(order))))
    where = []
    for name in names:
        host, port = info.addresses[name]
        if name == "metrics":
            scheme = "https" if name in info.tls else "http"
            where.append(f"metrics on {scheme}://{host}:{port}/metrics")
            continue
        if name == "http":
            where.append(f"HTTP on {'https' if name in info.tls else 'http'}://{host}:{port}/")
            continue
        where.append(f"{shown.get(name, name)} on {host}:{port}"
                     + (" (TLS)" if name in info.tls else ""))
    return f"figtank: serving {', '.join(where) or 'nothing'} (Ctrl-C stops)"


def _grace_secs(text: str) -> float:
    try:
        grace = float(text)
    except ValueError:
        grace = math.nan
    if not grace >= 0:  # also NaN
        raise ConfigError(f"--grace: expected a number of seconds >= 0 (got {text!r})")
    return grace


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from ``--config`` and the setting flags; raises ConfigError."""
    return load_settings(getattr(args, "config", None), flag_overrides(args))


#: ``figtank bench``'s line in ``figtank --help``; its arguments and runner are loaded only
#: when it runs (``figtank serve`` never imports the load generators).
BENCH_HELP: Final = ("measure figtank or any Tank/Figg endpoint under load (scenarios: see "
                     "--help)")


#: Each subcommand's help line, in ``figtank --help``'s order, and the module that holds
#: its arguments and runner (its ``COMMANDS[name]``, or its ``COMMAND`` when it holds one
#: command): a module is imported only when its command runs, so a client command starts
#: without the others' imports.
COMMAND_HELP: Final = {
    "serve": ("run the gateway: Figg, Tank, Kafka and HTTP listeners over one log (the "
              "embedded store, a Tank broker or a Kafka cluster)", ""),
    "publish": ("publish messages over Figg", "gateway.cli.clients"),
    "subscribe": ("print a Figg topic's messages", "gateway.cli.clients"),
    "produce": ("produce messages over Tank", "gateway.cli.clients"),
    "consume": ("print a Tank partition's messages", "gateway.cli.clients"),
    "fetch": ("print a partition's messages over Kafka (Fetch)", "gateway.cli.clients"),
    "topics": ("create, list or describe topics (Tank)", "gateway.cli.clients"),
    "status": ("the broker's status (Tank)", "gateway.cli.clients"),
    "inspect": ("dump a partition's segment and index files", "gateway.cli.clients"),
    "groups": ("list, describe or reset Kafka consumer groups' committed offsets (Kafka)",
               "gateway.cli.groups"),
    "bench": (BENCH_HELP, "gateway.bench.command"),
    "users": ("manage SASL users of the access policy file (Kafka listener)",
              "gateway.cli.users"),
}


def _load(name: str) -> Command:
    """The arguments and runner of subcommand ``name`` (its module imported now)."""
    module_name = COMMAND_HELP[name][1]
    if not module_name:
        return _add_serve_arguments, _run_serve
    module = importlib.import_module(module_name)
    command: Command = (module.COMMANDS[name] if hasattr(module, "COMMANDS")
                        else module.COMMAND)
    return command


#: What figtank is, in ``figtank --help`` (and pyproject.toml's description).
DESCRIPTION: Final = ("A pub/sub gateway: Figg, Tank, Kafka and HTTP clients over one log "
                      "(its embedded store, a Tank broker or a Kafka cluster).")


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are one line on stderr (with where to read more) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def _version() -> str:
    try:
        return metadata.version("figtank")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``figtank`` parser: every subcommand's arguments, or with ``argv`` those of the
    subcommand it names only (the others are listed, not loaded)."""
    parser = _Parser(
        prog="figtank", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"figtank {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (help_text, _) in COMMAND_HELP.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if chosen is None or name == chosen:
            add_arguments, run = _load(name)
            add_arguments(command)
            command.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``figtank`` console script.

    Exit status: 0 done, 1 a runtime failure, 2 a usage or configuration mistake, 130
    after Ctrl-C, 141 when the reader of stdout went away (``| head``: nothing is said).
    A failure is one line on stderr; ``--log-level debug`` adds the traceback.
    """
    args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run  # set by every command
    try:
        return run(args)
    except ConfigError as exc:
        print(f"figtank: configuration error: {exc}", file=sys.stderr)
        return 2
    except MissingExtra as exc:
        print(f"figtank {args.command}: {exc}", file=sys.stderr)
        return 1
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        if any(isinstance(leaf, StdoutClosed) for leaf in leaves(exc)):
            # Nothing left to say to a reader that is gone; the interpreter's last flush
            # of stdout at exit must not fail either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
        # trio hands a Ctrl-C over in a group when several tasks were running.
        if all(isinstance(leaf, KeyboardInterrupt | trio.Cancelled) for leaf in leaves(exc)):
            return 130
        if getattr(args, "log_level", None) == "debug":
            traceback.print_exception(exc)
        print(f"figtank {args.command}: unexpected {describe(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
