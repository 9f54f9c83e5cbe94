"""How the tests start Spark drivers' JVMs: the options every driver gets, and a
class-data-sharing (CDS) archive of the classes a Spark driver loads, kept in the pytest
cache between runs.

A driver's JVM spends much of its start loading and verifying the classes of Spark's
jars; mapped from an archive instead, they cost a fraction (the documented snippet's
run, tests/spark/test_docs_snippet.py, on this 2-core machine: 38 s of CPU without, 30 s
with; its session starts in 6.4 s, not 9.4 s). Java 17 makes such an archive of an
application's classes only when a JVM exits (``-XX:ArchiveClassesAtExit``; Java 19's
``-XX:+AutoCreateSharedArchive`` does not exist there): the tests' shared session makes
it on a run that finds none (about 170 MB, in .pytest_cache; not in a CI run, ``CI``
set, whose checkout no later run uses), and every driver of the later runs maps it
(``-XX:SharedArchiveFile``). A JVM that finds the archive unusable
(another JDK build, Spark's jars changed) runs without it, silently; the archive's name
holds the JDK's and Spark's identity, so such a change makes a new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

#: JVM options for every Spark driver the tests start (the session here, and the example
#: and docs-snippet processes through ``SPARK_SUBMIT_OPTS``): the client JIT only, and
#: the serial collector. The tests' JVMs live a minute or two on tiny data, so C2's
#: compilations never pay off (without them a driver starts and runs its first jobs
#: about a third faster on this 2-core machine), nor do a concurrent collector's
#: threads (the documented snippet's run: 51 s of CPU with G1, 46 s without). What
#: Spark does is the same. CDS's own log (thousands of "skipping" lines while an archive
#: is made, a line for an archive it cannot map) off: what the tests read of a driver's
#: standard error is Spark's and the program's.
SPARK_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xlog:cds=off "
                     "-Xlog:cds+dynamic=off")
#: Spark settings for the drivers started as processes, as Java system properties
#: (SparkConf reads ``spark.*`` ones; not allowed in ``extraJavaOptions``, so the
#: session here sets them in its builder): no web UI, which a test never opens (its
#: server takes a quarter of a driver's start).
SPARK_PROCESS_PROPERTIES = "-Dspark.ui.enabled=false"


class ClassArchive:
    """The drivers' class archive in ``directory`` (one file per JDK and Spark)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / f"spark-driver-{_identity()}.jsa"

    def exists(self) -> bool:
        return self.path.is_file()

    def use_options(self) -> str:
        """The options that map the archive, where there is one (else none)."""
        return f"-XX:SharedArchiveFile={self.path}" if self.exists() else ""

    def making(self) -> Path:
        """Where a JVM writes the archive it makes (:meth:`keep` puts it in place)."""
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.part")

    def keep(self) -> None:
        """The archive just made is the one to use; archives of other JDKs or Sparks go.
        (Replaced in one step: another worker's driver maps the old one or the new.)"""
        made = self.making()
        if not made.is_file() or made.stat().st_size == 0:
            made.unlink(missing_ok=True)  # the JVM did not exit cleanly: none this run
            return
        os.replace(made, self.path)
        for other in self.path.parent.glob("spark-driver-*.jsa"):
            if other != self.path:
                other.unlink(missing_ok=True)


def _identity() -> str:
    """A short digest of what an archive is valid for: the JDK (its ``libjvm``) and the
    Spark (its version and jars)."""
    import pyspark

    parts = [pyspark.__version__]
    jars = Path(pyspark.__file__).parent / "jars"
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") \
        else Path(shutil.which("java") or "java")
    for where in (java.resolve().parent.parent / "lib" / "server" / "libjvm.so", jars):
        with contextlib.suppress(OSError):
            stat = where.stat()
            parts.append(f"{where}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


#: The run's archive (set by tests/spark/conftest.py for the tests of this folder).
archive: ClassArchive | None = None


def driver_jvm_options() -> str:
    """:data:`SPARK_JVM_OPTIONS`, and the class archive's when there is one."""
    return " ".join(filter(None, (SPARK_JVM_OPTIONS,
                                  archive.use_options() if archive else "")))


def spark_process_env(root: Path) -> dict[str, str]:
    """The environment of a user of the venv running a Spark program from the checkout
    ``root``: no ``PYSPARK_PYTHON`` (``register`` must choose the workers' Python), no
    ``SPARK_CONF_DIR``; the driver JVM with :func:`driver_jvm_options` and
    :data:`SPARK_PROCESS_PROPERTIES`."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR")}
    env["PYTHONPATH"] = str(root)
    env["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, (
        env.get("SPARK_SUBMIT_OPTS"), driver_jvm_options(), SPARK_PROCESS_PROPERTIES)))
    return env
