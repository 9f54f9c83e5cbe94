"""A local Spark session (one for the whole run: the JVM is slow to start), a figtank
server in a background thread of the test process, and the drivers' class archive
(tests/spark/jvm.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark import jvm
from tests.spark.helpers import BackgroundServer

# Without the spark extra (pyspark, pyarrow) or Java these tests are not collected.
if (importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None
        or (shutil.which("java") is None and not os.environ.get("JAVA_HOME"))):
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session", autouse=True)
def class_archive(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[jvm.ClassArchive]:
    """The drivers' class archive, in the pytest cache (kept between runs; a run without
    the cache makes one in its temporary directory, for nothing)."""
    cache = getattr(request.config, "cache", None)
    directory = (cache.mkdir("spark-class-archive") if cache is not None
                 else tmp_path_factory.mktemp("spark-class-archive"))
    jvm.archive = jvm.ClassArchive(directory)
    yield jvm.archive
    jvm.archive = None


@pytest.fixture(scope="session")
def spark(class_archive: jvm.ClassArchive) -> Iterator[object]:
    # register() points the Python workers at this interpreter (the venv with figtank).
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from gateway.spark import register

    # Without an archive yet, this session's JVM makes one as it exits (what it loaded
    # for all the tests here: the classes every driver needs, and more), for the runs
    # that follow in this checkout. A CI run (``CI`` set, as CI services do) has none to
    # follow: writing the archive would only add half a minute to its end.
    making = not class_archive.exists() and not os.environ.get("CI")
    options = jvm.driver_jvm_options() + (
        f" -XX:ArchiveClassesAtExit={class_archive.making()}" if making else "")
    session = (SparkSession.builder.master("local[2]").appName("figtank-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               .config("spark.driver.extraJavaOptions", options)
               .config("spark.sql.streaming.pollingDelay", "10ms")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
    if making:  # the JVM writes the archive as it exits: end it now, and keep that
        gateway = SparkContext._gateway
        assert gateway is not None
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits when its standard input ends
        gateway.proc.wait(timeout=120)
        SparkContext._gateway = SparkContext._jvm = None
        class_archive.keep()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    running = BackgroundServer(tmp_path_factory.mktemp("figtank") / "data",
                               durability="os").start()
    yield running
    running.stop()


@pytest.fixture
def data_dir(server: BackgroundServer) -> Path:
    return server.data_dir
