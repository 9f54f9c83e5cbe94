"""Suite-wide fixtures."""

import signal
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gateway.io import fanout
from gateway.io.fanout import send_each_python
from tests.io.helpers import FANOUT_LOOPS
from tests.tls_certs import Certs, make_certs

#: The Spark tests, one unit of work for ``make test``'s workers (see
#: :func:`pytest_xdist_make_scheduler`): they share one Spark session (a JVM that takes
#: 15-20 s to start) and one server, per worker.
SPARK_TESTS = "tests/spark/"
#: Spark test files that start their own Spark in subprocesses (the documented snippet, the
#: examples) and use no shared session: units of their own, run beside the others.
SPARK_OWN_PROCESSES = ("tests/spark/test_docs_snippet.py", "tests/spark/test_examples.py")
#: The longest units of work, started first (by far: each holds minutes of builds or
#: JVMs); then the other files with tests marked ``slow``.
LONGEST = (SPARK_TESTS, "tests/test_install.py")


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C and quit at their defaults in this process, so in every process a test
    starts. A shell without job control starts a background command (``make test &``)
    with SIGINT and SIGQUIT ignored, every child inherits that, and Python leaves an
    inherited ignored SIGINT alone: the tests that stop a client with SIGINT would wait
    for a process that never sees it (which of them failed depended on which worker had
    run the Spark tests, whose session catches SIGINT)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest units first, then files with tests marked ``slow``, each file's tests
    kept together and in order: with ``make test``'s workers (``--dist loadfile
    --no-loadscope-reorder``) the long files start at once and the short ones fill the
    end, instead of one worker running a Spark or install file alone at the end of the
    run."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        where = item.path.relative_to(config.rootpath).as_posix()
        for i, start in enumerate(LONGEST):
            if where.startswith(start):
                return i
        return len(LONGEST) + (item.path not in slow_files)

    items.sort(key=rank)  # stable: order kept within


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile``, except that the Spark tests sharing a session are one unit (one
    worker runs them all, so the run starts one Spark session, not one per worker)."""
    if config.getoption("dist", None) != "loadfile":
        return None  # xdist's own scheduler for the mode asked for
    from xdist.scheduler import LoadFileScheduling

    class SparkTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SPARK_TESTS) and not nodeid.startswith(SPARK_OWN_PROCESSES):
                return SPARK_TESTS
            return super()._split_scope(nodeid)

    return SparkTogether(config, log)


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


@pytest.fixture(params=FANOUT_LOOPS, ids=lambda loop: "python" if loop is send_each_python
                else "compiled")
def loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fan-out groups' send loop for this run of the test (a test that takes it runs
    with each loop)."""
    monkeypatch.setattr(fanout, "send_each", request.param)
    return request.param
