"""Stock kafkajs (npm) as a real client of the suite: installed once, pinned, under the
checkout's ``.venv`` (ignored by git), and driven by ``kafkajs_steps.js`` in one node
process per call.

The install needs node and npm (``make test`` installs them with the other system
tools) and the npm registry; kafkajs has no dependencies of its own, so pinning its
version pins everything it runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

#: The kafkajs the suite tests against (the latest release).
KAFKAJS_VERSION: Final = "2.2.4"
_ROOT: Final = Path(__file__).resolve().parents[2]
#: Where it is installed: ``node_modules/kafkajs`` under this.
PREFIX: Final = _ROOT / ".venv" / "npm-kafkajs"
_STEPS: Final = Path(__file__).with_name("kafkajs_steps.js")


def _installed() -> bool:
    package = PREFIX / "node_modules" / "kafkajs" / "package.json"
    try:
        return bool(json.loads(package.read_text())["version"] == KAFKAJS_VERSION)
    except (OSError, ValueError, KeyError):
        return False


def ensure_kafkajs() -> Path:
    """The ``node_modules`` holding kafkajs :data:`KAFKAJS_VERSION`, installed with npm
    the first time (one installer at a time: the test workers share it)."""
    node_modules = PREFIX / "node_modules"
    if _installed():
        return node_modules
    npm = shutil.which("npm")
    assert npm, "npm is needed to install kafkajs (make test installs node and npm)"
    PREFIX.mkdir(parents=True, exist_ok=True)
    with open(PREFIX / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed():
            done = subprocess.run(
                [npm, "install", "--prefix", str(PREFIX), "--no-save", "--no-package-lock",
                 "--no-audit", "--no-fund", "--loglevel=error", f"kafkajs@{KAFKAJS_VERSION}"],
                capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"npm install kafkajs failed:\n{done.stderr}"
            assert _installed(), "npm installed another kafkajs"
    return node_modules


def run_kafkajs(broker: str, steps: list[dict[str, Any]], timeout: float = 60.0
                ) -> list[dict[str, Any]]:
    """Run ``steps`` (see ``kafkajs_steps.js``) with stock kafkajs against ``broker``
    (``host:port``) in one node process; one result per step. Blocking."""
    node = shutil.which("node")
    assert node, "node is needed to run kafkajs (make test installs it)"
    env = {**os.environ, "NODE_PATH": str(ensure_kafkajs())}
    done = subprocess.run([node, str(_STEPS)], input=json.dumps({"broker": broker,
                                                                 "steps": steps}),
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"kafkajs failed:\n{done.stderr}"
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def hexed(records: list[tuple[bytes | None, bytes]]) -> list[dict[str, str | None]]:
    """``(key, value)`` pairs as the steps take them."""
    return [{"key": None if k is None else k.hex(), "value": v.hex()} for k, v in records]


def unhexed(messages: list[dict[str, Any]]) -> list[tuple[int, bytes | None, bytes]]:
    """``(offset, key, value)`` of the messages a consume step read."""
    return [(m["offset"], None if m["key"] is None else bytes.fromhex(m["key"]),
             bytes.fromhex(m["value"])) for m in messages]
