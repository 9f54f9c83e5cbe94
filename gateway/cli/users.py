"""``figtank users add NAME``: make a SASL user's ``[[user]]`` entry for the policy file.

The password is read from ``--password-file`` (its first line), else asked for twice
on a terminal, else read from stdin (its first line). The entry holds SCRAM credentials
(salt, iterations, StoredKey, ServerKey), never the password; it is printed on stdout to
paste into ``auth.policy_file`` (then SIGHUP, or restart).
"""

from __future__ import annotations

import argparse
import getpass
import sys

from gateway.auth.sasl import MIN_ITERATIONS
from gateway.auth.users import user_entry

#: What ``--mechanism`` accepts; PLAIN is checked against the SCRAM-SHA-256 credential.
CHOICES = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")


class UsageError(Exception):
    """A bad argument or password: one line, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = sub.add_parser(
        "add", help="print the [[user]] entry of a new user (to paste into the policy file)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    add.add_argument("name", help="the user name (what clients give as sasl.username)")
    add.add_argument("--mechanism", action="append", choices=CHOICES, default=None,
                     help="a mechanism the user logs in with (repeatable; default: "
                     "SCRAM-SHA-256 and SCRAM-SHA-512; PLAIN uses the SCRAM-SHA-256 "
                     "credential)")
    add.add_argument("--iterations", type=int, default=MIN_ITERATIONS,
                     help=f"PBKDF2 iterations (at least {MIN_ITERATIONS}; default "
                     f"{MIN_ITERATIONS})")
    add.add_argument("--password-file", help="read the password from this file's first "
                     "line (default: prompt on a terminal, else stdin's first line)")


def _password(args: argparse.Namespace) -> str:
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                line = f.readline()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--password-file {args.password_file}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
    elif sys.stdin.isatty():
        line = getpass.getpass(f"password of {args.name}: ")
        if getpass.getpass("again: ") != line:
            raise UsageError("the passwords differ")
    else:
        line = sys.stdin.readline()
    password = line.rstrip("\r\n")
    if not password:
        raise UsageError("the password is empty")
    return password


def run(args: argparse.Namespace) -> int:
    """Print the entry; a bad argument is one line on stderr and exit status 2."""
    try:
        if args.iterations < MIN_ITERATIONS:
            raise UsageError(f"--iterations must be at least {MIN_ITERATIONS}, got "
                             f"{args.iterations}")
        mechanisms = set(args.mechanism or ("SCRAM-SHA-256", "SCRAM-SHA-512"))
        if "PLAIN" in mechanisms:
            mechanisms.add("SCRAM-SHA-256")
        entry = user_entry(args.name, _password(args), sorted(mechanisms), args.iterations)
    except (UsageError, ValueError) as exc:
        print(f"figtank users add: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(entry)
    return 0


#: The ``users`` subcommand of :mod:`gateway.cli.main`: (add arguments, run).
COMMAND = (add_arguments, run)
