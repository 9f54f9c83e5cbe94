"""figtank installed the way a user installs it, outside ``make``.

From a clean copy of the source (the files git knows, no build products): an sdist, and a
wheel built from that sdist (so the sdist is shown to compile the extensions with this
machine's compiler). The wheel alone goes into a new virtual environment with no extras,
and the installed ``figtank`` serves on free loopback ports while the installed client
subcommands publish over Figg and read over Tank and Kafka. Then the same sdist built
with no working C compiler: the install still works, in pure Python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.serving import figtank_serve

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: The compiled extensions a wheel built with a compiler carries.
EXTENSIONS = ("protocols/_speedups", "gateway/store/_fsync", "gateway/io/_fanout")
#: Time for one pip or build step (downloads come from the package index's cache).
STEP_TIMEOUT = 600


@dataclass
class Installed:
    """The built distributions and the environment the wheel went into."""

    sdist: Path
    wheel: Path
    env: Path
    home: Path  # a working directory outside the source tree

    def bin(self, name: str) -> Path:
        return self.env / "bin" / name

    def figtank(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin("figtank")), *args], capture_output=True,
                              text=True, timeout=timeout, cwd=self.home, env=clean_env())


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without what would let the source tree or the suite's own
    settings leak into the installed program."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FIGTANK_PURE_PYTHON")}
    return {**env, **extra}


def run(*command: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                            cwd=cwd, timeout=STEP_TIMEOUT, env=clean_env(**env))
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def clean_copy(destination: Path) -> Path:
    """The source files git tracks or would track (ignored ones, such as the venv and
    in-place build products, left out), copied to ``destination``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def new_env(path: Path) -> Path:
    """A new virtual environment without pip of its own (``ensurepip`` would take 10 s):
    :func:`pip_install` installs into it."""
    venv.EnvBuilder(with_pip=False, clear=True).create(path)
    return path


def pip_install(env: Path, wheel: Path, cwd: Path) -> None:
    """Install ``wheel`` and its dependencies into ``env`` with the suite's pip (what the
    environment's own pip would install: ``--python`` runs pip for that interpreter)."""
    run(sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install",
        "--quiet", wheel, cwd=cwd)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    work = tmp_path_factory.mktemp("install")
    source = clean_copy(work / "source")
    dist = work / "dist"
    # No --sdist/--wheel: build makes the sdist, then the wheel from the unpacked sdist.
    # Compiled without optimisation: what is tested is that the extensions are built,
    # carried and loaded, not their speed (half the build's time: 32 s against 64 s).
    # --no-isolation: with the build requirements the test extra installs (pyproject's
    # [build-system] requires; build checks they are there), not two new environments.
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source, cwd=work,
        CFLAGS="-O0")
    [sdist] = dist.glob("figtank-*.tar.gz")
    [wheel] = dist.glob("figtank-*.whl")
    env = new_env(work / "env")
    pip_install(env, wheel, work)
    home = work / "home"
    home.mkdir()
    yield Installed(sdist, wheel, env, home)


def test_the_wheel_carries_both_compiled_extensions(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    for extension in EXTENSIONS:
        assert [n for n in names if n.startswith(extension) and n.endswith(".so")], (
            f"{extension} missing from {installed.wheel.name}")
    # the package data the runtime reads, and no test or build leftovers
    assert any(n.startswith("protocols/tank/specs/") for n in names)
    assert {"gateway/http/static/index.html", "gateway/http/static/figtank.mjs",
            "gateway/http/static/figtank.d.ts"} <= set(names)
    assert not [n for n in names if n.startswith("tests/") or n.endswith(".pyx")]
    # The compiled modules' types travel with them (PEP 561), for the callers' mypy.
    assert {f"{extension}.pyi" for extension in EXTENSIONS} | {
        "protocols/py.typed", "gateway/py.typed"} <= set(names)


def test_the_sdist_carries_the_sources_to_build_from(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"setup.py", "pyproject.toml", "protocols/_speedups.pyx",
            "gateway/store/_fsync.pyx", "gateway/io/_fanout.pyx"} <= names
    assert not [n for n in names if n.endswith(".so")]


def test_the_installed_command_answers_without_extras(installed: Installed) -> None:
    version = installed.figtank("--version")
    assert (version.returncode, version.stdout.strip()) == (0, "figtank 0.1.0")
    helped = installed.figtank("--help")
    assert helped.returncode == 0
    for command in ("serve", "publish", "subscribe", "produce", "consume", "fetch",
                    "topics", "inspect", "users", "groups", "bench"):
        assert command in helped.stdout
    for command in ("serve", "publish", "consume", "fetch", "inspect", "users", "groups"):
        assert installed.figtank(command, "--help").returncode == 0, command


def test_a_command_that_needs_a_missing_extra_names_it(installed: Installed) -> None:
    probe = subprocess.run([str(installed.bin("python")), "-c", "import confluent_kafka"],
                           capture_output=True, cwd=installed.home, env=clean_env())
    assert probe.returncode != 0  # the extra really is missing here
    result = installed.figtank("bench", "kafka-produce", "--messages", "10")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "figtank bench: kafka-produce needs the 'bench' extra (confluent_kafka is not "
        "installed): pip install 'figtank[bench]'")
    assert result.stdout == ""
    # Upstream-Kafka mode needs no extra: figtank speaks Kafka to the cluster itself.
    backend = subprocess.run([str(installed.bin("python")), "-c",
                              "import gateway.backend.kafka"], capture_output=True,
                             cwd=installed.home, env=clean_env())
    assert backend.returncode == 0, backend.stderr


def serve_and_use(installed: Installed, data: Path) -> dict:
    """Serve with the installed command; publish over Figg, read back over Tank and
    Kafka with it, and over HTTP; the console's files are served. The server's
    ``figtank_serving`` log line."""
    program = [str(installed.bin("figtank"))]
    with figtank_serve("--data-dir", str(data), "--figg-listen", "127.0.0.1:0",
                       "--tank-listen", "127.0.0.1:0", "--kafka-listen", "127.0.0.1:0",
                       "--http-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                       cwd=installed.home, program=program) as server:
        assert server.figg and server.tank and server.kafka and server.http
        figg, tank, kafka = (f"{a[0]}:{a[1]}" for a in (server.figg, server.tank,
                                                        server.kafka))
        published = installed.figtank("publish", "--figg", figg, "orders", "a", "b", "c")
        assert published.returncode == 0, published.stderr
        consumed = installed.figtank("consume", "--tank", tank, "--json", "orders")
        assert consumed.returncode == 0, consumed.stderr
        assert [(m["seq"], m["value"]) for m in map(json.loads, consumed.stdout.split("\n")
                                                    [:-1])] == [(1, "a"), (2, "b"), (3, "c")]
        fetched = installed.figtank("fetch", "--kafka", kafka, "--json", "orders")
        assert fetched.returncode == 0, fetched.stderr
        assert [(m["offset"], m["value"]) for m in map(json.loads, fetched.stdout.split("\n")
                                                      [:-1])] == [(0, "a"), (1, "b"), (2, "c")]
        http = "http://{}:{}".format(*server.http)
        with urllib.request.urlopen(f"{http}/topics/orders/partitions/0/messages?offset=0",
                                    timeout=10) as answer:
            assert [m["value"] for m in json.load(answer)["messages"]] == ["a", "b", "c"]
        for page in ("/", "/figtank.js", "/figtank.mjs", "/figtank.d.ts"):
            with urllib.request.urlopen(f"{http}{page}", timeout=10) as answer:
                assert answer.status == 200 and answer.read()
        [serving] = server.events("figtank_serving")
        assert server.stop() == 0
    return serving


def test_the_installed_server_serves_every_client_family(installed: Installed,
                                                         tmp_path: Path) -> None:
    serving = serve_and_use(installed, tmp_path / "data")
    assert serving["hot_paths"] == "compiled"


def test_without_a_compiler_the_sdist_installs_in_pure_python(installed: Installed,
                                                              tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    # -v shows the build's own output; no cache, so the compiled wheel is not reused; the
    # build requirements the suite's (as for the compiled build)
    built = run(sys.executable, "-m", "pip", "wheel", "-v", "--no-cache-dir",
                "--no-build-isolation", "--no-deps", "--wheel-dir", wheels, installed.sdist,
                cwd=tmp_path, CC="false", CXX="false")
    assert "not built" in built.stdout + built.stderr  # the build said what it left out
    [wheel] = wheels.glob("figtank-*.whl")
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    pure = Installed(installed.sdist, wheel, new_env(tmp_path / "env"), installed.home)
    pip_install(pure.env, wheel, tmp_path)
    assert pure.figtank("--version").stdout.strip() == "figtank 0.1.0"
    serving = serve_and_use(pure, tmp_path / "data")
    assert serving["hot_paths"] == "pure-python"
