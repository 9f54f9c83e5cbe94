"""The compiled modules' stubs (``*.pyi``) say what the built modules have.

mypy checks every call into ``protocols._speedups``, ``gateway.store._fsync`` and
``gateway.io._fanout`` against their stubs; mypy's ``stubtest`` holds the stubs to the
modules this environment built (every name there, argument names and kinds alike).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from protocols import native

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("protocols._speedups", "gateway.store._fsync", "gateway.io._fanout")


def test_the_stubs_match_the_built_modules(tmp_path: Path) -> None:
    missing = [name for name in MODULES if native.built(name) is None]
    assert not missing, f"not built: {missing} (make test builds them)"
    # Cython's doctest table, not API.
    allowlist = tmp_path / "allowlist"
    allowlist.write_text(".*\\.__test__\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", "pyproject.toml",
         "--allowlist", str(allowlist), *MODULES],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_stubtest_finds_a_stub_that_differs(tmp_path: Path) -> None:
    # The check above can fail: here a stub names an argument the module does not have.
    stubs = tmp_path / "stubs"
    (stubs / "gateway" / "io").mkdir(parents=True)
    for init in (stubs / "gateway" / "__init__.pyi", stubs / "gateway" / "io" / "__init__.pyi"):
        init.write_text("")
    stub = (ROOT / "gateway" / "io" / "_fanout.pyi").read_text()
    (stubs / "gateway" / "io" / "_fanout.pyi").write_text(stub.replace("data:", "payload:"))
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "gateway.io._fanout"],
        cwd=tmp_path, env={**os.environ, "MYPYPATH": str(stubs)},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gateway.io._fanout.send_each" in done.stdout
    assert '"payload"' in done.stdout, done.stdout
