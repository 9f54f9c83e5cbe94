"""The arrays of tables of the access policy file (``[[user]]``, ``[[token]]``): their
shape, checked one way for every kind of entry. This module does no I/O."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any


def policy_tables(entries: object, section: str, keys: Sequence[str]
                  ) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(where, entry)`` for each table of ``[[section]]`` (``where`` is
    ``section[i]``, for error lines); ``ValueError`` with one line when ``entries`` is
    not an array of tables or an entry has a key outside ``keys``."""
    if not isinstance(entries, list):
        raise ValueError(f"{section}: must be an array of tables ([[{section}]])")
    for i, entry in enumerate(entries):
        where = f"{section}[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: expected a table")
        for key in entry:
            if key not in keys:
                raise ValueError(f"{where}.{key}: unknown key (expected {', '.join(keys)})")
        yield where, entry
