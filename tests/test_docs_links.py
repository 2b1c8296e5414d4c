"""Every relative link in README.md and docs/ points at a file that exists, and every #anchor into a
markdown file names one of its headings (GitHub's slug rule), so a newcomer following the docs
never lands on a 404."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*)", line)):
            out.add(slug(m.group(1)))
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return [a or b for a, b in LINK.findall(text)]


def test_slug_follows_githubs_rule():
    assert slug("The entropy lab — bench/entropy_lab.py") == "the-entropy-lab--benchentropy_labpy"
    assert slug("The quickstart, measured") == "the-quickstart-measured"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(
                f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})"
            )
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading with anchor #{anchor} in {dest.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n  " + "\n  ".join(broken)


CODE = [p for d in ("agentrl", "environments", "sandboxes") for p in sorted((ROOT / d).rglob("*.py"))]
POINTER = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")


def test_pointers_from_code_into_the_docs_resolve():
    """A docstring, comment or message that points at ``docs/X.md#anchor`` names a heading there."""
    broken = [
        f"{path.relative_to(ROOT)}: docs/{page}#{anchor}"
        for path in CODE
        for page, anchor in POINTER.findall(path.read_text())
        if not (ROOT / "docs" / page).exists() or anchor not in anchors(ROOT / "docs" / page)
    ]
    assert not broken, "pointers to no heading:\n  " + "\n  ".join(broken)
