"""The documentation holds together: every relative link of the README and `docs/` resolves to a file, and to a
heading of it when it names one; the semantics are cited as `docs/design.md`; the README stays short."""

from __future__ import annotations

import os
import re

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(
    [os.path.join(ROOT, "README.md")]
    + [
        os.path.join(folder, name)
        for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
        for name in names
        if name.endswith(".md")
    ]  # fmt: skip
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: str) -> str:
    """The page without its fenced code blocks (a link inside one is code, not a link)."""
    with open(path) as f:
        return re.sub(r"(?ms)^```.*?^```", "", f.read())


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters of any script, digits, `_`, `-` kept),
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.+)$", prose(path))}


def test_the_slug_is_githubs():
    assert slug("2. Estimators") == "2-estimators"
    assert slug("5. The coefficient β_t") == "5-the-coefficient-β_t"
    assert slug("KL in the reward (`kl_placement`)") == "kl-in-the-reward-kl_placement"


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_relative_links_resolve(page):
    links = [m.group(1) for m in LINK.finditer(prose(page))]
    for link in links:
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        assert os.path.exists(target), f"{link}: no {os.path.relpath(target, ROOT)}"
        if anchor:
            assert target.endswith(".md"), f"{link}: an anchor into a file that is not Markdown"
            assert anchor in anchors(target), f"{link}: no heading #{anchor} in {os.path.relpath(target, ROOT)}"


def test_every_page_is_reachable_from_the_readme():
    """Each page of docs/ is linked from the README or from a page the README links to."""
    reachable, todo = set(), [os.path.join(ROOT, "README.md")]
    while todo:
        page = todo.pop()
        if page in reachable:
            continue
        reachable.add(page)
        for link in (m.group(1) for m in LINK.finditer(prose(page))):
            path = link.partition("#")[0]
            target = os.path.normpath(os.path.join(os.path.dirname(page), path))
            if path.endswith(".md") and os.path.exists(target):
                todo.append(target)
    assert set(PAGES) <= reachable, sorted(os.path.relpath(p, ROOT) for p in set(PAGES) - reachable)


def test_the_semantics_are_cited_as_docs_design_md():
    """The design reference is in the repository: nothing cites a DESIGN.md outside it."""
    cited = []
    for folder in ("adaptive_kl", "tests", "docs", "benchmarks", "examples"):
        for base, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in names:
                if name.endswith((".py", ".md")) and name != os.path.basename(__file__):
                    with open(os.path.join(base, name)) as f:
                        if "DESIGN.md" in f.read():
                            cited.append(os.path.relpath(os.path.join(base, name), ROOT))
    with open(os.path.join(ROOT, "README.md")) as f:
        if "DESIGN.md" in f.read():
            cited.append("README.md")
    assert cited == []


def test_the_readme_is_for_users():
    """Short (≤ 250 lines), with the usage example near the top."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().splitlines()
    assert len(lines) <= 250
    assert next(i for i, line in enumerate(lines) if "AdaptiveKLGRPOTrainer(" in line) < 80
