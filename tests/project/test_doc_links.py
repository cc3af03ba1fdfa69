"""Every relative link in README.md and docs/ reaches a file of the checkout, and every #anchor a heading.

Anchors are the ones a code host derives from headings (GitHub's rule: lower case, punctuation but
hyphens and underscores dropped, spaces as hyphens, a repeat numbered -1, -2, ...), plus explicit
`<a id="...">` / `<a name="...">` targets.
"""
from __future__ import annotations

import functools
import pathlib
import re

import pytest

from tests.support.paths import REPO_ROOT

DOCUMENTS = [REPO_ROOT / "README.md", REPO_ROOT / "CHANGELOG.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """The anchor a code host gives a heading's text (GitHub's rule)."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its words
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text, flags=re.UNICODE)
    return text.replace(" ", "-")


@functools.cache
def anchors(path: pathlib.Path) -> frozenset[str]:
    """Every anchor of a markdown file: its headings' slugs (repeats numbered) and explicit ids."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return frozenset(out)


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link outside code blocks."""
    text = path.read_text(encoding="utf-8")
    blanked = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    blanked = re.sub(r"`[^`\n]*`", "``", blanked)
    return [(blanked.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(blanked)]


def test_slugs_follow_the_code_hosts_rule():
    assert slug("Start here: five tasks") == "start-here-five-tasks"
    assert slug("`ehr-eval --compare`, the page") == "ehr-eval---compare-the-page"
    assert slug("Serving (OIP v2)") == "serving-oip-v2"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(document):
    broken = []
    for line, target in links(document):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        destination = (document.parent / file_part).resolve() if file_part else document
        if not destination.exists():
            broken.append(f"line {line}: {target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"line {line}: {target} (no heading with that anchor)")
    assert not broken, f"{document.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_reached_from_the_readme():
    reached, todo = set(), [REPO_ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        for _, target in links(page):
            file_part = target.partition("#")[0]
            if file_part.endswith(".md") and not re.match(r"^[a-z][a-z0-9+.-]*:", file_part):
                destination = (page.parent / file_part).resolve()
                if destination.exists():
                    todo.append(destination)
    orphans = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "docs").rglob("*.md")
                     if p.resolve() not in reached)
    assert not orphans, f"docs pages no link from README.md leads to: {orphans}"
