"""Optional parts of figtank and the pip extras that install them.

The runtime needs only the dependencies ``pip install figtank`` brings. A part built on
an optional library imports it through :func:`require` where it is used (never at
start-up), so a missing extra is one clear line instead of a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

#: Extra name -> what it is for (the ``pip install 'figtank[NAME]'`` a user is told).
EXTRAS: Final = {
    "bench": "the Kafka benchmark client (confluent-kafka)",
    "spark": "the PySpark data source and sink (pyspark, pyarrow)",
    "docs": "the documentation site (mkdocs-material)",
    "jwt": "JWT bearer tokens on the HTTP listener (PyJWT with its crypto)",
    "test": "the test suite and its reference clients",
}


class MissingExtra(Exception):
    """An optional library is not installed; the message names the extra to install."""

    def __init__(self, purpose: str, extra: str, module: str) -> None:
        self.purpose = purpose
        self.extra = extra
        self.module = module
        super().__init__(f"{purpose} needs the '{extra}' extra ({module} is not installed): "
                         f"pip install 'figtank[{extra}]'")


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtra` naming ``extra``.

    ``purpose`` says what needed it, in the words a user knows ("figtank bench
    kafka-produce").
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and module.split(".")[0] != exc.name.split(".")[0]:
            raise  # the optional library is there but something it imports is broken
        raise MissingExtra(purpose, extra, module) from None
