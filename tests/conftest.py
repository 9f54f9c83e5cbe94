"""Suite-wide fixtures."""

import math
import os
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


#: Where the last runs' test durations are kept (the pytest cache), one key per pass
#: (``make test``'s pure-Python pass times differently).
DURATIONS_KEY = "figtank/test-seconds"


def _durations_key() -> str:
    return DURATIONS_KEY + ("-pure" if os.environ.get("FIGTANK_PURE_PYTHON") else "")


def unit_of(nodeid: str) -> str:
    """The unit of work ``make test``'s workers take a test in (its file, or the Spark
    tests sharing a session: :func:`pytest_xdist_make_scheduler`)."""
    if nodeid.startswith(SPARK_TESTS) and not nodeid.startswith(SPARK_OWN_PROCESSES):
        return SPARK_TESTS
    return nodeid.split("::", 1)[0]


def _known_durations(config: pytest.Config) -> dict[str, float]:
    """The durations the order is made from. A worker uses the controller's (read once,
    handed over by :func:`pytest_configure_node`): every worker must order the tests
    alike, whatever another run in this checkout writes to the cache meanwhile."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and DURATIONS_KEY in workerinput:
        return dict(workerinput[DURATIONS_KEY])
    cache = getattr(config, "cache", None)
    known = cache.get(_durations_key(), {}) if cache is not None else {}
    return known if isinstance(known, dict) else {}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(pytest-xdist, in the controller) the durations the workers order the tests by."""
    config = node.config
    if not hasattr(config, "_figtank_durations"):
        config._figtank_durations = _known_durations(config)
    node.workerinput[DURATIONS_KEY] = config._figtank_durations


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest units of work first, each file's tests kept together and in order:
    with ``make test``'s workers (``--dist loadfile --no-loadscope-reorder``, a worker
    takes the next unit as it runs out) the long ones start at once and the short ones
    fill the end, instead of one worker running a long file alone at the end of the
    run. How long a unit is: the sum of its tests' durations in the last run that ran
    them (kept in the pytest cache); without that, :data:`LONGEST`, then the files with
    tests marked ``slow``, then the rest."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    known = _known_durations(config)
    seconds: dict[str, float] = {}
    for item in items:
        if item.nodeid in known:
            unit = unit_of(item.nodeid)
            seconds[unit] = seconds.get(unit, 0.0) + known[item.nodeid]

    def rank(item: pytest.Item) -> tuple[int, float]:
        where = item.path.relative_to(config.rootpath).as_posix()
        first = next((i for i, start in enumerate(LONGEST) if where.startswith(start)),
                     len(LONGEST) + (item.path not in slow_files))
        if not seconds:
            return first, 0.0
        # A unit the last runs did not time (new, or not run): first if it is one of
        # the long ones, else last.
        unknown = math.inf if first <= len(LONGEST) else 0.0
        return 0, -seconds.get(unit_of(item.nodeid), unknown)

    items.sort(key=rank)  # stable: order kept within


#: This run's test durations (setup, call and teardown), by test id: in the process that
#: reports (with workers, the controller, which sees every worker's reports).
_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Keep this run's durations for the next run's order (a worker's are the
    controller's to keep)."""
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _durations:
        return
    kept = cache.get(_durations_key(), {})
    kept.update({nodeid: round(secs, 3) for nodeid, secs in _durations.items()})
    cache.set(_durations_key(), kept)


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
