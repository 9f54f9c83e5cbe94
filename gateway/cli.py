"""The ``figtank`` command: ``serve`` runs the gateway; the other subcommands are clients."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from gateway.config import ConfigError, Settings, add_setting_flags, flag_overrides, load_settings
from gateway.logs import configure_logging

#: Subcommand name -> (function that adds its arguments, function that runs it).
Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML config file (flags override it)")
    parser.add_argument("--grace", type=float, default=2.0,
                        help="seconds open connections get to finish at shutdown")
    add_setting_flags(parser)


def _run_serve(args: argparse.Namespace) -> int:
    from gateway.server import serve_until_signalled

    settings = settings_from_args(args)
    configure_logging(settings.log_level, settings.log_format)
    trio.run(lambda: serve_until_signalled(settings, grace=args.grace))
    return 0


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from ``--config`` and the setting flags; raises ConfigError."""
    return load_settings(getattr(args, "config", None), flag_overrides(args))


def _commands() -> dict[str, tuple[str, Command]]:
    from gateway.bench.cli import COMMAND as BENCH
    from gateway.cli_clients import COMMANDS

    return {
        "serve": ("run the gateway (Figg and Tank listeners over one log)",
                  (_add_serve_arguments, _run_serve)),
        **COMMANDS,
        "bench": BENCH,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="figtank", description="A pub/sub gateway: Figg and Tank clients over one log.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, (add_arguments, run)) in _commands().items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command)
        command.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``figtank`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"figtank: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
