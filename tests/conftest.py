"""Suite-wide fixtures."""

from collections.abc import Iterator

import pytest
import structlog

from tests.tls_certs import Certs, make_certs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with tests marked ``slow`` first, each file's tests kept together and in
    order: with ``make test``'s workers (``--dist loadfile --no-loadscope-reorder``) the
    long files start at once and the short ones fill the end, instead of one worker
    running a Spark or install file alone at the end of the run."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within


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
