"""A local Spark session (one for the whole run: the JVM is slow to start) and a figtank
server in a background thread of the test process."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.helpers import SPARK_JVM_OPTIONS, BackgroundServer

# Without the spark extra (pyspark, pyarrow) or Java these tests are not collected.
if (importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None
        or (shutil.which("java") is None and not os.environ.get("JAVA_HOME"))):
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    # register() points the Python workers at this interpreter (the venv with figtank).
    from pyspark.sql import SparkSession

    from gateway.spark import register

    session = (SparkSession.builder.master("local[2]").appName("figtank-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               .config("spark.driver.extraJavaOptions", SPARK_JVM_OPTIONS)
               .config("spark.sql.streaming.pollingDelay", "10ms")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    running = BackgroundServer(tmp_path_factory.mktemp("figtank") / "data",
                               durability="os").start()
    yield running
    running.stop()


@pytest.fixture
def data_dir(server: BackgroundServer) -> Path:
    return server.data_dir
