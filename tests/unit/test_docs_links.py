"""Every relative link in README.md and docs/*.md leads to a file that exists, and every #anchor to a heading.

Anchors are made as GitHub makes them: lower case, punctuation other than '-' and '_' dropped, spaces to '-',
a repeated heading suffixed -1, -2, ...
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _anchors(page: Path) -> set[str]:
    found: dict[str, int] = {}
    anchors = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        title = re.sub(r"`([^`]*)`", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = found.get(slug, 0)
        found[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> list[str]:
    text, fenced, out = page.read_text(encoding="utf-8"), False, []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if not fenced:
            out += LINK.findall(line)
    return [link for link in out if not re.match(r"^[a-z]+:", link)]  # http:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(page):
    broken = []
    for link in _links(page):
        target, _hash, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.name}")
    assert not broken, "\n".join(broken)
