"""``figtank publish`` that fails part-way says how many messages were acknowledged, and
``--skip N`` resumes after them: a real ``figtank serve`` whose data directory is a small
tmpfs (mounted here; the tests run as root) fills up mid-stream, the space is given back
(the tmpfs grown), and the rerun completes the topic with every line once, in order."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving import figtank_serve
from tests.test_cli_failures import addr, figtank

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def consumed(tank: str, topic: str) -> list[bytes]:
    """The topic's values in order (the lines carry no tabs: the value is the last field)."""
    result = figtank("consume", "--tank", tank, "--json", topic)
    assert result.returncode == 0, result.stderr.decode()
    return [json.loads(line)["value"].encode() for line in result.stdout.splitlines()]


def test_publish_reports_what_was_acknowledged_and_resumes(small_disk: Path) -> None:
    lines = [b"%05d " % i + base64.b64encode(os.urandom(1500)) for i in range(1000)]
    stdin = b"\n".join(lines) + b"\n"
    # durability os: a failed write is reported at once, so the connection stops before
    # its next read. (Under fsync a read's call waits for its fsync round to report a
    # failed bundle, and a later, smaller call may be stored meanwhile: unacknowledged
    # lines after a gap, which a resume then stores again.)
    with figtank_serve("--data-dir", str(small_disk / "data"), "--figg-listen", "127.0.0.1:0",
                       "--durability", "os",
                       "--tank-listen", "127.0.0.1:0", "--http-listen", "",
                       "--kafka-listen", "", "--metrics-listen", "") as server:
        figg, tank = addr(server.figg), addr(server.tank)
        failed = figtank("publish", "--figg", figg, "--timeout", "5", "--log-level", "error",
                         "--json", "full", "-", stdin=stdin)
        assert failed.returncode == 1
        [report] = failed.stderr.decode().splitlines()  # one line
        found = re.search(r"; (\d+) of (\d+) messages acknowledged; resume after them with "
                          r"--skip (\d+)$", report)
        assert found is not None, report
        acked, sent, skip = map(int, found.groups())
        assert skip == acked and 0 < acked < 1000 and acked <= sent <= 1000
        [record] = [json.loads(line) for line in failed.stdout.splitlines()]
        assert record["acknowledged"] == acked and record["complete"] is False
        # Every acknowledged line is stored, in order, before anything else.
        before = consumed(tank, "full")
        assert len(before) >= acked and before == lines[:len(before)]

        subprocess.run(["mount", "-o", "remount,size=16M", str(small_disk)], check=True)
        resumed = figtank("publish", "--figg", figg, "--timeout", "10", "full", "-",
                          "--skip", str(acked), stdin=stdin)
        assert resumed.returncode == 0, resumed.stderr.decode()
        assert resumed.stdout.decode() == (f"{1000 - acked} messages published to full and "
                                           "acknowledged\n")
        after = consumed(tank, "full")
        # The acknowledged lines once; the rest once, after them. (A line stored but not
        # acknowledged when the disk filled would be here twice; none was.)
        assert after == before + lines[acked:]
        assert len(before) == acked
        # --skip counts the command line's messages as it counts stdin's lines.
        done = figtank("publish", "--figg", figg, "args", "a", "b", "c", "--skip", "2")
        assert done.stdout.decode() == "1 message published to args and acknowledged\n"
        assert consumed(tank, "args") == [b"c"]
        assert server.stop() == 0
