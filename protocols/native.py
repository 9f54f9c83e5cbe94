"""The compiled inner loops (``protocols._speedups``), when built and not disabled.

The extension is built by ``pip install`` when a C compiler is there. Every function in it
has a pure-Python reference next to the code that uses it, and the two are held to the same
results by the differential tests. ``FIGTANK_PURE_PYTHON=1`` in the environment makes the
package ignore the extension (``make test`` runs the suite both ways).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING, Final

__all__ = ["PURE_PYTHON_ENV", "built", "compiled", "implementation", "pure_python_requested",
           "speedups"]

#: Set to anything but ``""`` or ``"0"`` to use the pure-Python code only.
PURE_PYTHON_ENV: Final = "FIGTANK_PURE_PYTHON"


def pure_python_requested() -> bool:
    """Whether :data:`PURE_PYTHON_ENV` asks for the pure-Python code."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def built(name: str) -> ModuleType | None:
    """The compiled module ``name`` (dotted) if it was built, whatever
    :data:`PURE_PYTHON_ENV` says: the differential tests hold it to its reference in
    either run."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def compiled(name: str) -> ModuleType | None:
    """The compiled module ``name`` (dotted), or None when it is not built or
    :data:`PURE_PYTHON_ENV` asks for the pure-Python code."""
    return None if pure_python_requested() else built(name)


#: The extension module, or None when the pure-Python code is in use.
if TYPE_CHECKING:
    # Typed by protocols/_speedups.pyi, so that every call into it is checked. mypy takes
    # it for always there (a module can not be spelt ``X | None``); every user tests it
    # against None first, as it must at run time (``make test`` runs them both ways).
    from protocols import _speedups as speedups
else:
    speedups = compiled("protocols._speedups")


def implementation() -> str:
    """``"compiled"`` or ``"pure-python"``: what the hot paths run (logged at start-up)."""
    return "compiled" if speedups is not None else "pure-python"
