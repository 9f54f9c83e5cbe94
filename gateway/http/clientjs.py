"""figtank.js from one source, two ways: ``static/figtank.mjs`` is the ES module (``export
class Figtank``), served as it is at ``/figtank.mjs``; the classic script ``/figtank.js``
(for ``<script src>``, defining ``window.Figtank``) is derived from it when first asked
for, by :func:`classic_script`.

Why derived rather than one file loaded both ways: a file with an ``export`` statement is
a syntax error as a classic script, and a classic (UMD) file can not be imported by name
(``import {Figtank} from``) as a module. The transformation is kept trivial so that it can
not change what the code does: the source may have exactly one ``export``, ``export class
Figtank``, and no ``import``; the classic script is that source without the word
``export``, inside a function (so nothing but ``Figtank`` reaches the global scope) in
strict mode (as a module always is), ending with ``root.Figtank = Figtank``. A source
that breaks the rule is refused, not half-converted.
"""

from __future__ import annotations

import re
from typing import Final

_EXPORT: Final = re.compile(r"^export class Figtank\b", re.MULTILINE)
_MODULE_SYNTAX: Final = re.compile(r"^\s*(export|import)\b", re.MULTILINE)


def classic_script(module: str) -> str:
    """The classic script of the ES module source ``module`` (see the module doc);
    ``ValueError`` when ``module`` is not of the one form this converts."""
    if len(_EXPORT.findall(module)) != 1 or len(_MODULE_SYNTAX.findall(module)) != 1:
        raise ValueError("the figtank.js source must have one export, 'export class "
                         "Figtank', and no import")
    head, _, body = ("\n" + module).partition("\nexport class Figtank")
    return (f"{head[1:]}\n(function (root) {{\n\"use strict\";\n\nclass Figtank{body.rstrip()}\n\n"
            "root.Figtank = Figtank;\n"
            "})(typeof window !== \"undefined\" ? window : globalThis);\n")
