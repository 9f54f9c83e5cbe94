"""structlog set-up: one JSON object a line, or a console renderer on a terminal."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO, cast

import structlog

__all__ = [
    "configure_logging",
]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write.

    Binding the stream object at configure time breaks when it is later replaced and
    closed (a test harness capturing output, a daemon redirecting it).
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _Fields:
    """A processor adding the same fields to every line (a worker's ``worker``)."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = dict(fields)

    def __call__(self, logger: object, name: str, event: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
        for key, value in self._fields.items():
            event.setdefault(key, value)
        return event


def configure_logging(level: str = "info", fmt: str = "auto",
                      fields: Mapping[str, Any] | None = None) -> None:
    """Configure structlog for the process.

    ``fmt``: ``json`` (one line an event), ``console`` (colours, for people), or
    ``auto`` (console when stderr is a terminal, else JSON). Logs go to stderr so
    that a command's output on stdout stays clean for programs. ``fields`` are added to
    every line.
    """
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer = (structlog.dev.ConsoleRenderer() if fmt == "console"
                else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *([_Fields(fields)] if fields else []),
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # One write a line (print() makes two): the workers of `figtank serve --workers`
        # share the stream, and a line written whole is not cut by another's.
        logger_factory=structlog.WriteLoggerFactory(file=cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=True,
    )
