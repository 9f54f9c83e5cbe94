"""The Spark page's snippet (docs/spark.md), run as it is under this interpreter (the
venv's) with ``PYSPARK_PYTHON`` unset: ``register`` must make the workers run this Python."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.helpers import BackgroundServer, produce
from tests.spark.jvm import spark_process_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def docs_snippet() -> str:
    """The first Python block of the Spark page."""
    section = (ROOT / "docs" / "spark.md").read_text().split("# Spark\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_docs_snippet_runs_without_pyspark_python(server: BackgroundServer) -> None:
    produce(server, "orders", {0: 3}, tag="readme")
    code = docs_snippet()
    assert '"127.0.0.1:11011"' in code
    code = code.replace('"127.0.0.1:11011"', repr(server.endpoint))  # the test's server
    env = spark_process_env(ROOT)
    # In the server's data directory's parent: the snippet reads the segments of ./data.
    result = subprocess.run([sys.executable, "-c", code], cwd=server.data_dir.parent,
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "readme-0-2" in result.stdout  # df.show(): read by a Python worker
    [count] = re.findall(r"^(\d+) messages in the segment files", result.stdout, re.M)
    assert int(count) >= 3
    with server.client() as client:  # the snippet's writes went through
        assert client.discover_partitions("copy")[0].high_water_mark >= 3
        upper = client.consume("orders-upper", 0, 1).messages  # the streaming one
    assert b"README-0-2" in [m.value for m in upper]
