"""structlog set-up: one JSON object a line, or a console renderer on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog

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


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog for the process.

    ``fmt``: ``json`` (one line an event), ``console`` (colours, for people), or
    ``auto`` (console when stderr is a terminal, else JSON). Logs go to stderr so
    that a command's output on stdout stays clean for programs.
    """
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer = (structlog.dev.ConsoleRenderer() if fmt == "console"
                else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=True,
    )
