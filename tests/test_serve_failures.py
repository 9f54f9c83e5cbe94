"""``figtank serve`` start-up failures: one line on stderr naming the setting, exit status 2,
nothing on stdout, no traceback; and what stays up (a bridge whose upstream is away)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

LOOPBACK = "127.0.0.1:0"
PREFIX = "figtank: configuration error: "


def serve(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    """``figtank serve`` on ephemeral loopback ports with ``args`` (which override them)."""
    command = [sys.executable, "-m", "gateway.cli", "serve", "--tank-listen", LOOPBACK,
               "--figg-listen", LOOPBACK, "--metrics-listen", LOOPBACK, "--kafka-listen", "",
               "--http-listen", "",
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a failed start printed, after checking exit status 2 and stdout."""
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(PREFIX)
    return lines[0].removeprefix(PREFIX)


@pytest.mark.parametrize(("flag", "key"), [("--figg-listen", "listen.figg"),
                                           ("--tank-listen", "listen.tank"),
                                           ("--metrics-listen", "listen.metrics")])
def test_port_in_use(tmp_path: Path, flag: str, key: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        line = error_line(serve(flag, address, cwd=tmp_path))
    assert line.startswith(f"{key}: cannot listen on {address}: the address is already in use")
    assert line.endswith(f"choose another address with {flag} HOST:PORT")
    # Nothing was started: not even the store.
    assert not (tmp_path / "data").exists()


def write_topic_config(tmp_path: Path, key: str, value: str) -> Path:
    config = tmp_path / "figtank.toml"
    config.write_text(f'[topics.config]\n"{key}" = "{value}"\n')
    return config


def test_unknown_topic_config_key(tmp_path: Path) -> None:
    config = write_topic_config(tmp_path, "log.segmnt.bytes", "1")
    line = error_line(serve("--config", str(config), cwd=tmp_path))
    assert line.startswith("topics.config: unknown Tank config key 'log.segmnt.bytes' "
                           "(known: log.segment.bytes, ")


def test_bad_topic_config_value(tmp_path: Path) -> None:
    config = write_topic_config(tmp_path, "log.segment.bytes", "abc")
    line = error_line(serve("--config", str(config), cwd=tmp_path))
    assert line == ("topics.config: bad value 'abc' for 'log.segment.bytes': "
                    "cannot parse size 'abc'")


@pytest.mark.parametrize("where", ["/proc/nope", "a-file"])
def test_unusable_data_dir(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    line = error_line(serve("--data-dir", where, cwd=tmp_path))
    assert line.startswith(f"store.data_dir: cannot use {where!r}: ")
    assert line.endswith("with --data-dir DIR")


def test_unreadable_store_file(tmp_path: Path) -> None:
    # A directory where a segment file belongs: the store can not be opened.
    (tmp_path / "data" / "orders" / "0" / "1_1700000000.log").mkdir(parents=True)
    line = error_line(serve("--data-dir", "data", cwd=tmp_path))
    assert line.startswith("store.data_dir: cannot open the store in data: ")
    assert "1_1700000000.log" in line


@pytest.mark.parametrize("grace", ["-1", "soon"])
def test_bad_grace_is_refused_before_starting(tmp_path: Path, grace: str) -> None:
    line = error_line(serve("--grace", grace, cwd=tmp_path))
    assert line == f"--grace: expected a number of seconds >= 0 (got {grace!r})"
    assert not (tmp_path / "data").exists()
