"""Builds the optional compiled parts (Cython): ``protocols._speedups``, the inner loops
of the protocol hot paths, and ``gateway.store._fsync``, the fsync workers that run without
the GIL, and ``gateway.io._fanout``, the
loop that sends the same bytes to many subscribers' sockets.

Everything else is declared in ``pyproject.toml``. Without a C compiler (or with a
failing build) the install goes on with a warning and the package runs its pure-Python
code, which is the reference anyway (see ``protocols/native.py``).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

EXTENSIONS = {
    "protocols._speedups": "protocols/_speedups.pyx",
    "gateway.store._fsync": "gateway/store/_fsync.pyx",
    "gateway.io._fanout": "gateway/io/_fanout.pyx",
}


def _warn(exc: BaseException, name: str = "the compiled extensions") -> None:
    print(f"WARNING: {name} not built ({exc}); figtank runs its pure-Python code",
          file=sys.stderr)


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns and goes on when the extension does not compile, and
    compiles the extensions side by side (one per core) unless told otherwise (``-j``)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            _warn(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(exc, ext.name)


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize

        return cythonize(
            [Extension(name, [source]) for name, source in EXTENSIONS.items()],
            compiler_directives={"language_level": "3"},
            nthreads=os.cpu_count() or 1,
        )
    except Exception as exc:  # no Cython, or it refused the source
        _warn(exc)
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
