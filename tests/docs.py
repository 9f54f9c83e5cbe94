"""Reading README.md and the documentation site's pages (docs/, mkdocs.yml) in tests."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"

_FENCE = re.compile(r"^```")
#: [text](target) and ![alt](target), not inside code spans.
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def page(name: str) -> str:
    """The text of docs/``name``."""
    return (DOCS / name).read_text()


def pages() -> list[Path]:
    """Every Markdown page of the site."""
    return sorted(DOCS.rglob("*.md"))


def between(text: str, start: str, end: str) -> str:
    """What lies between the markers ``start`` and ``end`` (each must be there)."""
    assert start in text, f"missing {start!r}"
    after = text.split(start, 1)[1]
    assert end in after, f"missing {end!r}"
    return after.split(end, 1)[0]


def prose_lines(text: str) -> Iterator[str]:
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def code_blocks(text: str, language: str | None = None) -> Iterator[str]:
    """The fenced code blocks (of ``language`` only, when given), without their fences."""
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if language is None or match.group(1) == language:
            yield match.group(2)


def links(text: str) -> list[str]:
    """The targets of the Markdown links outside code (blocks and spans)."""
    found = []
    for line in prose_lines(text):
        found.extend(_LINK.findall(re.sub(r"`[^`]*`", "", line)))
    return found


def slugify(heading: str) -> str:
    """A heading's anchor, as mkdocs (Python-Markdown's toc) and GitHub make it for the
    headings these pages use: no two spaces or hyphens in a row."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown file's headings."""
    return {slugify(line.lstrip("#").strip()) for line in prose_lines(text)
            if re.match(r"^#{1,6} ", line)}


def nav_pages(nav: object) -> Iterator[str]:
    """The page paths of an mkdocs ``nav`` (nested lists and {title: page} entries)."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for entry in nav:
            yield from nav_pages(entry)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)
