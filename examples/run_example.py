"""How every example ends: data on stdout, at most one line on stderr when it fails, and
an exit status: 0 done, 1 failed (server not running, a topic refused, ...), 2 bad
arguments (argparse), 130 after Ctrl-C.

Each example's ``main`` returns its exit status (or None for 0) and lets the client's
exceptions (:class:`~gateway.client.errors.ClientError`, ``OSError``) and
:class:`Failed` propagate; :func:`run_example` turns them into ``<example>: <message>``.
Any other exception is a bug in the example and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from gateway.client.errors import ClientError
from gateway.client.figg_blocking import BlockingFiggClient
from gateway.core.logs import configure_logging

EXPECTED: tuple[type[BaseException], ...] = (ClientError, OSError)

#: Options of the examples' Figg clients: give up connecting after 3 attempts (a few
#: seconds, then ``ConnectError``) rather than redial a server that is not there forever.
FIGG_OPTIONS: dict[str, Any] = {"first_connect_attempts": 3}


class Failed(Exception):
    """A failure an example explains in its message (exit status 1)."""


def run_example(main: Callable[[], int | None]) -> NoReturn:
    """Run ``main`` and exit with its status, or 1 / 130 as the module docstring says."""
    # The clients log reconnects and the like; the one error line below says it all.
    configure_logging("error")
    try:
        status = main()
    except (KeyboardInterrupt, Exception) as exc:  # SystemExit (argparse) passes through
        sys.exit(exit_status(exc))
    sys.exit(status or 0)


def exit_status(exc: BaseException) -> int:
    """130 for Ctrl-C, 1 (after one line on stderr) for an expected failure; re-raise
    anything else. Trio may wrap either in exception groups."""
    leaves = list(_leaves(exc))
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        return 130
    for leaf in leaves:
        if isinstance(leaf, (*EXPECTED, Failed)):
            fail(str(leaf) or type(leaf).__name__)
            return 1
    raise exc


def fail(message: str) -> None:
    """Print ``<example>: <message>`` (one line) on stderr."""
    line = " ".join(message.split())  # one line, whatever the message held
    print(f"{Path(sys.argv[0]).stem}: {line}", file=sys.stderr, flush=True)


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, or the exceptions at the leaves of an exception group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def wait_figg_connected(client: BlockingFiggClient, address: tuple[str, int],
                        timeout: float = 10) -> None:
    """Wait until ``client`` is connected; :class:`Failed` after ``timeout`` seconds (a
    server that accepts no connection and refuses none), ``ConnectError`` sooner when
    the client gives up (see :data:`FIGG_OPTIONS`)."""
    try:
        client.wait_connected(timeout=timeout)
    except TimeoutError:
        host, port = address
        raise Failed(f"no Figg server answered at {host}:{port} within {timeout:g} s "
                     f"(is figtank serve running?)") from None
