"""The documentation site (docs/, mkdocs.yml): it builds without a broken link or anchor,
every page is in the nav, and the pages are true to the code where the code can say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from gateway.core.config import reference_table
from gateway.kafka.versions import served_table
from tests.docs import DOCS, MKDOCS_YML, ROOT, between, code_blocks, nav_pages, page, pages


def test_the_site_builds_with_no_broken_link_or_anchor(tmp_path: Path) -> None:
    # mkdocs.yml's validation settings make a broken link, a missing anchor, an absolute
    # link or a page left out of the nav a warning, and --strict fails on any warning.
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    for markdown in pages():
        relative = markdown.relative_to(DOCS).with_suffix("")
        built = site / ("index.html" if relative.name == "index" else relative / "index.html")
        assert built.is_file(), f"{markdown} was not built"


def test_mkdocs_yml_fails_on_broken_links() -> None:
    config = yaml.safe_load(MKDOCS_YML.read_text())
    assert config["theme"]["name"] == "material"
    assert config["validation"] == {"omitted_files": "warn", "absolute_links": "warn",
                                    "unrecognized_links": "warn", "anchors": "warn"}


def test_every_page_is_in_the_nav_once() -> None:
    listed = list(nav_pages(yaml.safe_load(MKDOCS_YML.read_text())["nav"]))
    assert len(listed) == len(set(listed)), "a page is in the nav twice"
    on_disk = {p.relative_to(DOCS).as_posix() for p in pages()}
    assert set(listed) == on_disk, (
        f"not in the nav: {sorted(on_disk - set(listed))}; "
        f"in the nav, no such page: {sorted(set(listed) - on_disk)}")
    assert listed[0] == "index.md"


def test_configuration_reference_matches_the_code() -> None:
    documented = between(page("configuration.md"), "<!-- config-reference:start -->\n",
                         "\n<!-- config-reference:end -->")
    assert documented == reference_table(), (
        "docs/configuration.md's table is stale: paste "
        "gateway.core.config.reference_table()")


def test_kafka_api_table_matches_what_api_versions_answers() -> None:
    documented = between(page("kafka.md"), "<!-- kafka-apis:start -->\n",
                         "\n<!-- kafka-apis:end -->")
    assert documented == served_table(), (
        "docs/kafka.md's Kafka API table is stale: paste "
        "gateway.kafka.versions.served_table()")


def test_the_architecture_tree_matches_the_folders() -> None:
    # The tree under "one folder per part" lists every package of gateway/ and protocols/,
    # and every module file it names exists in its folder.
    tree = between(page("architecture.md"), "one folder per part:\n\n```\n", "```")
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
               for base in ("gateway", "protocols") for p in ROOT.glob(f"{base}/*/__init__.py")}
    assert folders <= {k for k in listed if (ROOT / k).is_dir()}, "the tree misses a folder"
    for folder, descriptions in listed.items():
        for word in " ".join(descriptions).replace(",", " ").replace("(", " ").split():
            if word.endswith((".py", ".pyx")):
                path = ROOT / folder / word if (ROOT / folder).is_dir() else ROOT / word
                assert path.exists() or (ROOT / folder.split("/")[0] / word).exists(), (
                    f"the tree names {word} in {folder}, which does not exist")


def test_kcat_commands_reach_the_default_kafka_listener() -> None:
    # The kcat lines of the Kafka page (and the README's) are for `make run`: they name
    # the Kafka listener's default address and kcat's produce, consume, list or query mode.
    default = reference_table().split("| `listen.kafka` | `--kafka-listen` | `", 1)[1]
    default = default.split("`", 1)[0]
    shown = [line for text in (page("kafka.md"), (ROOT / "README.md").read_text())
             for block in code_blocks(text, "sh")
             for line in block.replace("\\\n", " ").splitlines()
             if re.search(r"(^|\| )kcat ", line)]
    assert len(shown) >= 10
    for line in shown:
        command = line.split("kcat ", 1)[1]
        assert f"-b {default} " in command, line
        assert re.search(r" -[PCLQG]\b", command), line


def _as_on_the_site(text: str) -> str:
    """Text of the README as the site's front page words it: links from docs/ (``docs/x.md``
    -> ``x.md``), lines wrapped anywhere."""
    return " ".join(text.replace("](docs/", "](").split())


def test_the_front_page_says_what_the_readme_says() -> None:
    # The quick start's prerequisites and ports, and the install section (extras), are
    # written once in the README and copied onto the site's front page: a listener, port
    # or extra added to one and not the other fails here.
    readme = (ROOT / "README.md").read_text()
    index = page("index.md")
    for start, end in (("Both commands create `.venv`", "It says where it listens"),
                       ("It says where it listens", "```sh"),
                       ("`make run` and `make test` install the checkout", "## ")):
        assert " ".join(between(index, start, end).split()) == _as_on_the_site(
                between(readme, start, end)), (
            f"docs/index.md differs from README.md in the part from {start!r}")


def test_the_front_page_lists_every_page() -> None:
    listed = set(re.findall(r"\]\(([a-z-]+\.md)\)", page("index.md")))
    on_disk = {p.relative_to(DOCS).as_posix() for p in pages()} - {"index.md"}
    assert on_disk <= listed, f"not on the front page: {sorted(on_disk - listed)}"


def test_help_and_the_package_name_every_listener_and_backend() -> None:
    import tomllib

    from gateway.cli.main import DESCRIPTION

    described = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert described == DESCRIPTION
    helps = [" ".join(subprocess.run([sys.executable, "-m", "gateway.cli", *command, "--help"],
                                     capture_output=True, text=True, timeout=60,
                                     check=True).stdout.split())
             for command in ([], ["serve"])]
    for text in helps:
        for name in ("Figg, Tank, Kafka and HTTP", "embedded store", "a Tank broker",
                     "a Kafka cluster"):
            assert name in text, f"{name!r} missing from {text!r}"


def test_the_deployment_page_names_every_port_the_image_exposes() -> None:
    exposed = re.search(r"^EXPOSE (.+)$", (ROOT / "deploy" / "Dockerfile").read_text(),
                        re.MULTILINE)
    assert exposed is not None
    text = " ".join(page("deployment.md").split())
    for port in exposed.group(1).split():
        assert re.search(rf"\b{port} \(", text), f"docs/deployment.md does not name {port}"


def test_the_architecture_drawing_names_every_listener_and_backend() -> None:
    from gateway.core.config import PROTOCOLS

    drawing = next(code_blocks(page("architecture.md")))
    for protocol in PROTOCOLS:
        name = protocol if protocol == "metrics" else (
            protocol.upper() if protocol == "http" else protocol.capitalize())
        assert f"{name} listener" in drawing, f"the drawing has no {name} listener"
    for backend in ("embedded store", "upstream Tank broker", "upstream Kafka cluster"):
        assert backend in drawing, f"the drawing has no {backend}"


def test_the_architecture_page_says_which_section_each_part_receives() -> None:
    # Its table of sections names every section written in gateway/ with the file it is
    # in, and a line for every listener of the server's table; its way to add a listener
    # names the table.
    from gateway.server.listeners import LISTENERS

    text = page("architecture.md")
    table = between(text, "## How settings reach each part", "## Adding a listener")
    named = dict(re.findall(r"\| `(\w+)` \(`([\w/]+\.py)`\) \|", table))
    written = {name: path.relative_to(ROOT / "gateway").as_posix()
               for path in (ROOT / "gateway").rglob("*.py")
               for name in re.findall(r"^class (\w+)\(Section\)", path.read_text(),
                                      re.MULTILINE)}
    assert named == written, "docs/architecture.md's table of sections is stale"
    for kind in LISTENERS:
        assert f"| {kind.shown} listener | `{kind.section.__name__}`" in table, kind.name
    adding = between(text, "## Adding a listener", "## ")
    assert "`server/listeners.py`'s table `LISTENERS`" in " ".join(adding.split())
