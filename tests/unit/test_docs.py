"""The README stays a front door: at most 300 lines, the quick start on its first screen, and
every link from it (and between the pages under docs/) leads to a file, and to a heading there
when it names one. The supported-models table in docs/models.md names what the zoo holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.models.zoo import FAMILIES, KNOWN_REFUSALS, QUANTIZED, zoo_name

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
FIRST_SCREEN = 40  # lines: a terminal, or a browser's first view of the rendered page


def test_the_readme_fits_in_300_lines() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_the_quick_start_is_on_the_first_screen() -> None:
    first = README.read_text().splitlines()[:FIRST_SCREEN]
    assert "## Quick start" in first
    assert "    make run" in first and "    make test" in first


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def links(page: Path) -> list[str]:
    """Relative links, outside code blocks and code spans."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def targets(page: Path) -> set[Path]:
    return {(page.parent / t.partition("#")[0]).resolve() for t in links(page)}


def test_every_docs_page_is_reached_from_the_readme() -> None:
    """Linked from the README, or from a page the README links: a page no one links to is a
    page no one reads."""
    near = targets(README)
    reached = near.union(*(targets(page) for page in PAGES if page.resolve() in near))
    assert not [p.name for p in PAGES[1:] if p.parent.name == "docs" and p.resolve() not in reached]


def test_the_models_table_names_the_zoo() -> None:
    """`python -m bench families --write` writes the table; a family added to the zoo (or a
    refusal that changed) without it shows here."""
    text = (REPO / "docs/models.md").read_text()
    block = text.split("<!-- families:begin -->")[1].split("<!-- families:end -->")[0]
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip().strip("|").split(" | ")]
        for line in block.splitlines() if line.startswith("| ") and not line.startswith("| ---"))
        if cells[0] != "family (mlx-lm model_type)"}
    assert set(rows) == set(FAMILIES) | {zoo_name(f, 4) for f in QUANTIZED}
    refused = {(name, layout) for name, cells in rows.items()
               for layout, cell in zip(("pp", "tp"), cells[1:], strict=True)
               if cell.startswith("refused")}
    assert refused == set(KNOWN_REFUSALS)
