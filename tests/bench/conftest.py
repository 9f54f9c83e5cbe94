"""A figtank (``figtank serve`` in a child process) for the benchmark tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.bench.serving import Served, serve_figtank


@pytest.fixture(scope="package")
def figtank() -> Iterator[Served]:
    with serve_figtank("--kafka-listen", "127.0.0.1:0", durability="os") as served:
        yield served


@pytest.fixture
def endpoints(figtank: Served) -> list[str]:
    """The options that point a scenario at the test's figtank."""
    return ["--tank", figtank.tank, "--figg", figtank.figg, "--target", "figtank-test",
            "--server-pid", str(figtank.process.pid)]
