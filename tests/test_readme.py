"""The README is the newcomer's entry point: keep it true to the code."""

from pathlib import Path

from gateway.cli.main import build_parser
from gateway.server.config import reference_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_names_the_two_commands_first() -> None:
    text = README.read_text()
    quick_start = text.split("## Quick start", 1)[1].split("##", 1)[0]
    assert "make run" in quick_start and "make test" in quick_start
    assert text.index("make run") < text.index("## What figtank is for")


def test_configuration_reference_matches_the_code() -> None:
    text = README.read_text()
    between = text.split("<!-- config-reference:start -->\n", 1)[1]
    documented = between.split("\n<!-- config-reference:end -->", 1)[0]
    assert documented == reference_table(), (
        "README's configuration table is stale: paste gateway.server.config.reference_table()")


def test_subcommands_shown_in_the_readme_exist() -> None:
    text = README.read_text()
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    shown = {line.split()[1] for line in text.splitlines()
             if line.startswith(".venv/bin/figtank ")}
    assert shown and shown <= set(choices)
