"""The README is the newcomer's entry point: keep it true to the code."""

from pathlib import Path

from gateway.cli.main import build_parser
from gateway.kafka.versions import served_table
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


def test_kafka_api_table_matches_what_api_versions_answers() -> None:
    text = README.read_text()
    between = text.split("<!-- kafka-apis:start -->\n", 1)[1]
    documented = between.split("\n<!-- kafka-apis:end -->", 1)[0]
    assert documented == served_table(), (
        "README's Kafka API table is stale: paste gateway.kafka.versions.served_table()")


def test_subcommands_shown_in_the_readme_exist() -> None:
    text = README.read_text()
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    shown = {line.split()[1] for line in text.splitlines()
             if line.startswith(".venv/bin/figtank ")}
    assert shown and shown <= set(choices)


def test_the_architecture_tree_matches_the_folders() -> None:
    # The tree under "one folder per part" lists every package of gateway/ and protocols/,
    # and every module file it names exists in its folder.
    text = README.read_text()
    tree = text.split("one folder per part:\n\n```\n", 1)[1].split("```", 1)[0]
    root = README.parent
    listed: dict[str, list[str]] = {}
    top = ""
    for line in tree.splitlines():
        if not line.startswith(" "):
            top = line.split()[0].rstrip("/")
            continue
        names, _, rest = line.strip().partition("  ")
        if line.startswith("  ") and not line.startswith("   "):
            for name in names.split():
                listed.setdefault(f"{top}/{name.rstrip('/')}", []).append(rest)
        else:  # a continuation line: more description of the folder above
            listed[list(listed)[-1]].append(line.strip())
    folders = {f"{p.parent.parent.name}/{p.parent.name}"
               for base in ("gateway", "protocols") for p in root.glob(f"{base}/*/__init__.py")}
    assert folders <= {k for k in listed if (root / k).is_dir()}, "README tree misses a folder"
    for folder, descriptions in listed.items():
        for word in " ".join(descriptions).replace(",", " ").replace("(", " ").split():
            if word.endswith((".py", ".pyx")):
                path = root / folder / word if (root / folder).is_dir() else root / word
                assert path.exists() or (root / folder.split("/")[0] / word).exists(), (
                    f"README tree names {word} in {folder}, which does not exist")
