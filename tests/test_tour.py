"""Executes the guided tour (docs/tour/*.md): every ```python block of a page runs, in
order, in one namespace per page, from the repository root, so the tour cannot drift from
the code. A block that raises (an assert included) fails that page's test.

Blocks fenced as ```python run; any other fence (```text, ```bash, ```py-noexec) is prose.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour"
PAGES = sorted(p for p in TOUR.glob("*.md") if re.match(r"\d\d-", p.name))
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of a Markdown page."""
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in FENCE.finditer(text)]


def test_collector_finds_blocks_in_order():
    text = "x\n```python\na = 1\n```\n\n```text\nnot run\n```\n```python\nb = a + 1\n```\n"
    blocks = python_blocks(text)
    assert [code for _, code in blocks] == ["a = 1\n", "b = a + 1\n"]
    assert [line for line, _ in blocks] == [3, 10]


def test_every_concept_has_a_page():
    assert len(PAGES) == 17, [p.name for p in PAGES]
    index = (TOUR / "README.md").read_text(encoding="utf-8")
    for page in [*PAGES, TOUR / "glossary.md"]:
        assert f"]({page.name})" in index, f"docs/tour/README.md does not link {page.name}"


def test_links_and_pictures_exist():
    """Every relative link and picture of the tour (code, figures, other pages) exists."""
    for page in [*PAGES, TOUR / "README.md", TOUR / "glossary.md"]:
        for target in re.findall(r"\](?!\([a-z]+:)\(([^)#]+)", page.read_text(encoding="utf-8")):
            assert (TOUR / target).resolve().exists(), f"{page.name}: broken link {target}"


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_tour_page(page: Path, monkeypatch):
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    assert blocks, f"{page.name} has no python block"
    monkeypatch.chdir(ROOT)
    threads = torch.get_num_threads()
    namespace: dict = {"__name__": f"tour_{page.stem.replace('-', '_')}"}
    start = time.perf_counter()
    try:
        for line, code in blocks:
            # Padded so a traceback names the page's own line numbers.
            source = "\n" * (line - 1) + code
            exec(compile(source, str(page.relative_to(ROOT)), "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    limit = float(os.environ.get("AIAYN_TOUR_PAGE_LIMIT_S", "30"))
    assert seconds < limit, f"{page.name} took {seconds:.1f}s (limit {limit:.0f}s)"
