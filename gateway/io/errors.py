"""One exception map at each socket edge (after httpcore's ``map_exceptions``).

An edge (a listener's session, a client's connection) says once which low-level failures
become its own exception, and with what reason, and wraps its socket calls in that map::

    _RECEIVE_ERRORS = socket_errors("receive", ConnectionLost)
    ...
    with _RECEIVE_ERRORS:
        data = await stream.receive_some(RECEIVE_SIZE)

A map holds no state: build it once (a module constant) and enter it as often as needed.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Final, Literal, TypeAlias

import trio

#: What a trio stream raises when the peer or the socket is gone.
STREAM_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError)
#: What a socket call raises when the peer or the socket is gone: trio's stream errors
#: and any ``OSError`` (``ConnectionResetError``, ``BrokenPipeError``, ...).
SOCKET_ERRORS: Final = (*STREAM_ERRORS, OSError)

ExceptionTypes: TypeAlias = type[BaseException] | tuple[type[BaseException], ...]
Rule: TypeAlias = tuple[ExceptionTypes, Callable[[BaseException], BaseException]]


class ExceptionMap:
    """``with exception_map:`` raises ``make(exc)`` (chained to ``exc``) for the first rule
    ``(types, make)`` whose types ``exc`` is an instance of; anything else passes through,
    and so do ``trio.Cancelled`` and ``KeyboardInterrupt`` unless a rule names them."""

    __slots__ = ("_rules",)

    def __init__(self, *rules: Rule) -> None:
        self._rules = rules

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> Literal[False]:
        if exc is None:
            return False
        for types, make in self._rules:
            if isinstance(exc, types):
                raise make(exc) from exc
        return False


def failed(action: str, make: Callable[[str], BaseException]
           ) -> Callable[[BaseException], BaseException]:
    """A rule's ``make``: ``make(f"{action} failed: {exc!r}")``, the one reason an edge
    reports for a socket failure."""
    return lambda exc: make(f"{action} failed: {exc!r}")


def socket_errors(action: str, make: Callable[[str], BaseException]) -> ExceptionMap:
    """The map of a socket edge: a broken or closed stream and any ``OSError`` become
    ``make(f"{action} failed: {exc!r}")``."""
    return ExceptionMap((SOCKET_ERRORS, failed(action, make)))
