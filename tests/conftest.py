"""Suite-wide fixtures."""

from collections.abc import Iterator

import pytest
import structlog

from tests.tls_certs import Certs, make_certs


@pytest.fixture(autouse=True)
def _isolated_logging_config() -> Iterator[None]:
    # Some tests run `figtank` entry points in-process, and those configure structlog for
    # the process; restore the previous configuration so no test inherits another's.
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate
    (alice), made once for the run (per test worker)."""
    return make_certs(tmp_path_factory.mktemp("certs"))
