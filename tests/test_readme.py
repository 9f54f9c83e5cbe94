"""The README is the newcomer's front page: short, the two commands first, links that
work (it is not part of the documentation site, whose build checks the pages' links), and
commands that do what it says."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.main import build_parser
from tests.docs import README, ROOT, anchors, code_blocks, links, pages
from tests.serving import figtank_serve

MAX_LINES = 250
#: How a shown command starts the figtank client: the venv's console script, or an
#: installed one.
FIGTANK = re.compile(r"(?:^|\| )(?:\.venv/bin/)?figtank (.*)$")


def test_readme_is_a_front_page_under_250_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < MAX_LINES, f"README.md has {len(lines)} lines: move text to docs/"


def test_the_two_commands_come_first() -> None:
    text = README.read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    assert sections[1].startswith("Quick start\n")
    first_block = next(code_blocks(sections[1]))
    assert first_block.splitlines()[0].startswith("make run ")
    assert first_block.splitlines()[1].startswith("make test ")


def test_relative_links_in_the_readme_resolve() -> None:
    checked = 0
    for target in links(README.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (README.parent / path) if path else README
        assert file.exists(), f"README.md links to {target}: no such file"
        if anchor:
            assert file.suffix == ".md", f"README.md links to {target}: an anchor of a non-page"
            assert anchor in anchors(file.read_text()), (
                f"README.md links to {target}: {path or 'README.md'} has no such heading")
        checked += 1
    assert checked >= 10


def test_the_readme_links_every_page_of_the_site() -> None:
    linked = {target.partition("#")[0] for target in links(README.read_text())}
    missing = [p.relative_to(ROOT).as_posix() for p in pages()
               if p.relative_to(ROOT).as_posix() not in linked]
    assert not missing, f"README.md does not link {missing}"


def _figtank_commands() -> list[tuple[str, str]]:
    """(where, arguments) of each figtank command in the sh blocks of the README and of
    the site's pages, line continuations joined and comments dropped."""
    found = []
    for path in (README, *pages()):
        for block in code_blocks(path.read_text(), "sh"):
            for line in block.replace("\\\n", " ").splitlines():
                match = FIGTANK.search(line)
                if match:
                    arguments = shlex.split(match.group(1), comments=True)
                    found.append((f"{path.relative_to(ROOT)}: {line.strip()}", arguments))
    return found


def test_figtank_commands_shown_parse() -> None:
    # Every subcommand, action and flag shown exists (`--help` exits 0).
    commands = _figtank_commands()
    assert len(commands) >= 20
    parser = build_parser()
    for where, arguments in commands:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(arguments)
        except SystemExit as exit:
            assert exit.code == 0, f"{where}: {stderr.getvalue().strip()}"


def test_the_readme_shows_the_client_subcommands() -> None:
    shown = {arguments[0] for where, arguments in _figtank_commands()
             if where.startswith("README.md")}
    assert {"publish", "subscribe", "produce", "consume", "topics", "groups"} <= shown


def _try_it_blocks() -> list[list[str]]:
    """The lines of the README's try-it blocks: Figg, Tank, Kafka, HTTP."""
    section = README.read_text().split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    return [block.splitlines() for block in code_blocks(section, "sh")]


@pytest.mark.slow
def test_the_readme_try_it_commands_work(tmp_path: Path) -> None:
    """The README's try-it lines, run in order against a real ``figtank serve`` (its
    addresses in place of the defaults), each ending by itself (``--follow`` left out) with
    exit status 0; a stream the line says Ctrl-C stops is cut after a few seconds. kcat and
    curl are Debian packages ``make test`` installs where they are missing."""
    blocks = _try_it_blocks()
    assert [len(block) for block in blocks] == [5, 5, 5, 5]  # Figg, Tank, Kafka, HTTP
    figg, tank, kafka, http = blocks
    for tool in ("kcat", "curl"):
        assert shutil.which(tool), f"{tool} is not installed (make test installs it)"
    lines = [*figg, *tank, *kafka, *http]
    figtank = f"{shlex.quote(sys.executable)} -m gateway.cli"
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--tank-listen", "127.0.0.1:0",
                       "--figg-listen", "127.0.0.1:0", "--kafka-listen", "127.0.0.1:0",
                       "--http-listen", "127.0.0.1:0", "--metrics-listen", "") as server:
        assert server.figg and server.tank and server.kafka and server.http
        endpoints = {"figg": server.figg, "tank": server.tank, "kafka": server.kafka}
        flags = {"publish": "figg", "subscribe": "figg", "produce": "tank", "consume": "tank",
                 "topics": "tank", "status": "tank", "groups": "kafka"}
        outputs = []
        for line in lines:
            command, _, comment = (part.strip() for part in line.partition("  #"))
            if "--follow" in command:
                continue
            stream = "Ctrl-C stops" in comment
            command = command.replace("127.0.0.1:9092", "{}:{}".format(*server.kafka))
            command = command.replace("127.0.0.1:8080", "{}:{}".format(*server.http))
            match = FIGTANK.search(command)
            if match:
                name = match.group(1).split()[0]
                host, port = endpoints[flags[name]]
                command = (command[:match.start(1)].replace(".venv/bin/figtank", figtank)
                           + match.group(1) + f" --{flags[name]} {host}:{port}")
            if stream:
                command = f"timeout 3 {command}"
            result = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path,
                                    capture_output=True, text=True, timeout=60,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
            assert result.returncode in ((0, 124) if stream else (0,)), (
                f"{line}\n{result.stdout}{result.stderr}")
            outputs.append((line, result.stdout))
    replay = next(out for line, out in outputs if "--from 0 --count 5" in line)
    assert [row.split("\t")[0] for row in replay.splitlines()] == ["1", "2", "3", "4", "5"]
    as_json = next(out for line, out in outputs if "--json" in line)
    assert '"offset": 5' in as_json
    consumed = next(out for line, out in outputs if line.startswith(".venv/bin/figtank consume"))
    assert consumed.splitlines()[-1].endswith("k1\tthird")
    # HTTP: the posted message takes the offset after the last Figg and Tank ones
    posted = json.loads(next(out for line, out in outputs if "-X POST" in line))
    last = int(consumed.splitlines()[-1].split("\t")[0])
    assert posted["offsets"] == [{"partition": 0, "offset": last + 1}]
    events = next(out for line, out in outputs if "/events" in line)
    assert "data:" in events and "id:" in events


def test_the_docs_pages_named_in_deploy_and_examples_exist() -> None:
    # The deployment files and the examples' README say where things are documented.
    for path in [*ROOT.glob("deploy/*"), *ROOT.glob("deploy/*/*"), ROOT / "examples/README.md"]:
        if path.is_file():
            for name in re.findall(r"docs/([\w/-]+\.md)", path.read_text()):
                assert (ROOT / "docs" / name).is_file(), f"{path} names docs/{name}"
