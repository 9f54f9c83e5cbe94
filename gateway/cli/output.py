"""How the client subcommands show results: data on stdout, everything else on stderr.

Text mode writes one tab-separated line a record; payloads are escaped so that a line is
always one record (``\\t``, ``\\n``, ``\\r``, ``\\\\`` and other control characters as
escapes, bytes that are not UTF-8 as ``\\xNN``). ``--json`` writes one JSON object a
line; a payload field holds the text when the bytes are UTF-8, else ``null`` with the
bytes in base64 under ``<field>_base64``.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

_CONTROL_ESCAPES = {**{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)},
                    ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}


def escaped(data: bytes | None) -> str:
    """``data`` as one line of text that tells every byte string apart."""
    if data is None:
        return ""
    # A backslash byte never occurs inside a multi-byte UTF-8 sequence, so doubling it
    # first keeps the escapes added below unambiguous.
    text = data.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return text.translate(_CONTROL_ESCAPES)


def json_payload(name: str, data: bytes | None) -> dict[str, Any]:
    """The JSON fields for one payload: ``{name: text}`` or ``{name: None, name_base64: ...}``."""
    if data is None:
        return {name: None}
    try:
        return {name: data.decode()}
    except UnicodeDecodeError:
        return {name: None, f"{name}_base64": base64.b64encode(data).decode()}


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 message``, ``2 messages`` (``nouns``: the plural when not ``noun`` + s)."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {nouns or noun + 's'}"


class StdoutClosed(Exception):
    """Whoever read stdout went away (``figtank inspect ... | head``): the command stops
    quietly, as a Unix filter killed by SIGPIPE does."""


class Output:
    """Writes results for a person, or one JSON object a line with ``--json``."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._progress_shown = False

    def record(self, text: str, **fields: object) -> None:
        """One result: ``text`` for a person, ``fields`` as JSON."""
        self.end_progress()
        try:
            print(json.dumps(fields) if self.as_json else text, flush=True)
        except BrokenPipeError:
            raise StdoutClosed from None

    def note(self, text: str) -> None:
        """A line for the person on stderr (never mixed into the data on stdout)."""
        self.end_progress()
        print(f"figtank: {text}", file=sys.stderr, flush=True)

    def progress(self, text: str) -> None:
        """A progress line on stderr, rewritten in place, only on a terminal."""
        if sys.stderr.isatty():
            print(f"\r{text}", end="", file=sys.stderr, flush=True)
            self._progress_shown = True

    def end_progress(self) -> None:
        if self._progress_shown:
            print(file=sys.stderr)
            self._progress_shown = False
