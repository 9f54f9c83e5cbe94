"""Suite-wide fixtures."""

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _isolated_logging_config() -> Iterator[None]:
    # Some tests run `figtank` entry points in-process, and those configure structlog for
    # the process; restore the previous configuration so no test inherits another's.
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
