"""How a serving process ends: ``figtank serve``'s, its supervisor's and each worker's
exit status from what their trio run returned or raised."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Awaitable, Callable

import trio

from gateway.core.config import ConfigError, Settings
from gateway.extras import MissingExtra
from gateway.io.allocator import keep_large_buffers


def run_serving(serve: Callable[[], Awaitable[int | None]], settings: Settings) -> int:
    """``trio.run(serve)``'s exit status (None: 0), the C allocator tuned first
    (``server.allocator_keep_bytes``). A ConfigError or MissingExtra is
    raised for the caller to report; any other failure is one line and 1; Ctrl-C is
    KeyboardInterrupt. Tracebacks only with ``--log-level debug``."""
    keep_large_buffers(settings.allocator_keep_bytes)
    try:
        status = trio.run(serve)
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        found = leaves(exc)
        if all(isinstance(leaf, KeyboardInterrupt) for leaf in found):
            raise KeyboardInterrupt from None
        if settings.log_level == "debug":
            traceback.print_exception(exc)
        for leaf in found:
            if isinstance(leaf, ConfigError | MissingExtra):
                raise leaf from None
        failure = next((leaf for leaf in found if not isinstance(leaf, KeyboardInterrupt)),
                       exc)
        print(f"figtank: serve failed: {describe(failure)}", file=sys.stderr)
        return 1
    return status or 0


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` alone."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def describe(exc: BaseException) -> str:
    """``Type: message`` (the type alone when the message is empty)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
