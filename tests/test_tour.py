"""Executes the guided tour (docs/tour/*.md): every ```python block of a page runs, in
order, in one namespace per page, from the repository root, so the tour cannot drift from
the code. A block that raises (an assert included) fails that page's test.

What a block prints is part of the page: a block that prints must be followed by an
```output block (only blank lines between) holding what it prints, and the test compares
the two. Numbers written with a decimal point or an exponent match within one unit of their
last printed digit (``0.35`` matches 0.34 to 0.36); integers and all other text match
exactly, up to runs of whitespace; ``...`` in an output block matches any text (for
timings, and for what depends on the data found). After a deliberate change,
``AIAYN_TOUR_UPDATE=1 pytest tests/test_tour.py`` rewrites the output blocks that no longer
match (and adds missing ones) from what the blocks print now: read the diff.

Blocks fenced as ```python run; ```output is expected output; any other fence (```text,
```bash) is prose.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour"
FIGURES = ROOT / "docs" / "figures"
# Pages are numbered 00-17; a page inserted later takes the number before it and a letter
# (00b- follows 00-), so no page is renumbered and no link breaks.
PAGES = sorted(p for p in TOUR.glob("*.md") if re.match(r"\d\d[a-z]?-", p.name))
FENCE = re.compile(r"^```(python|output)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])")


@dataclass
class Block:
    line: int  # first line of the code in the page
    code: str
    output: str | None = None  # the expected output, if the page gives one
    output_span: tuple[int, int] | None = None  # where the output's body sits in the page
    end: int = 0  # where the python block's closing fence ends


def python_blocks(text: str) -> list[Block]:
    """Every ```python block of a Markdown page, with the ```output block after it."""
    blocks: list[Block] = []
    end = 0
    for m in FENCE.finditer(text):
        line = text[: m.start()].count("\n") + 2
        if m.group(1) == "python":
            blocks.append(Block(line, m.group(2), end=m.end()))
        elif not blocks or blocks[-1].output is not None or text[end : m.start()].strip():
            raise ValueError(f"line {line - 1}: an ```output block must follow a ```python block")
        else:
            blocks[-1].output, blocks[-1].output_span = m.group(2), m.span(2)
        end = m.end()
    return blocks


def _pieces(expected: str) -> list[tuple[str, str]]:
    """Expected output as (kind, text) pieces: "text", "number" or "any" (``...``)."""
    pieces = []
    for i, part in enumerate(re.split(r"(\.\.\.)", expected)):
        if i % 2:
            pieces.append(("any", part))
            continue
        last = 0
        for m in NUMBER.finditer(part):
            pieces.append(("text", part[last : m.start()]))
            pieces.append(("number", m.group()))
            last = m.end()
        pieces.append(("text", part[last:]))
    return [p for p in pieces if p[1] or p[0] == "any"]


def _tolerance(number: str) -> float:
    """One unit of the last printed digit; integers: exact."""
    mantissa, _, exponent = number.lower().partition("e")
    if "." not in mantissa and not exponent:
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals) * 1.000001


def output_mismatch(expected: str, actual: str) -> str | None:
    """None if ``actual`` matches ``expected`` (the rules of the module docstring), else
    what differs."""
    expected, actual = expected.strip(), actual.strip()
    pieces = _pieces(expected)
    pattern = ""
    for kind, text in pieces:
        if kind == "any":
            pattern += "(?:.*?)"
        elif kind == "number":
            pattern += r"([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf)"
        else:
            pattern += r"\s+".join(re.escape(w) for w in re.split(r"\s+", text))
            pattern = pattern.replace(r"\s+\s+", r"\s+")
    m = re.fullmatch(pattern, actual, re.S)
    if m is None:
        return "the text differs"
    numbers = [text for kind, text in pieces if kind == "number"]
    for want, got in zip(numbers, m.groups()):
        value = float(got)
        if math.isnan(value) or abs(value - float(want)) > _tolerance(want):
            return f"printed {got} where the page says {want}"
    return None


def test_output_matching_rules():
    assert output_mismatch("w = 0.35, n = 12", "w = 0.3549, n = 12") is None
    assert output_mismatch("w = 0.35", "w = 0.37") is not None
    assert output_mismatch("n = 12", "n = 13") is not None
    assert output_mismatch("tensor([[0.1,  0.2]])", "tensor([[0.1, 0.2]])") is None
    assert output_mismatch("took ... ms\nok", "took 17 ms\nok") is None
    assert output_mismatch("1.5e-03", "1.46e-03") is None
    assert output_mismatch("1.5e-03", "1.7e-03") is not None
    assert output_mismatch("x-1 and -0.5", "x-1 and -0.5") is None
    assert output_mismatch("a b", "a c") == "the text differs"


def test_collector_pairs_code_with_its_output():
    text = (
        "x\n```python\na = 1\n```\n\n```output\n1\n```\n"
        "```text\nnot run\n```\n```python\nb = 2\n```\n"
    )
    blocks = python_blocks(text)
    assert [(b.code, b.output) for b in blocks] == [("a = 1\n", "1\n"), ("b = 2\n", None)]
    assert [b.line for b in blocks] == [3, 13]
    with pytest.raises(ValueError, match="must follow"):
        python_blocks("```python\na\n```\nprose\n```output\n1\n```\n")


def test_every_concept_has_a_page():
    numbered = [p.name[:2] for p in PAGES if p.name[2] == "-"]
    assert numbered == [f"{i:02d}" for i in range(18)], [p.name for p in PAGES]
    inserted = [p.name for p in PAGES if p.name[2] != "-"]
    assert all(name[:2] in numbered for name in inserted), inserted  # 00b follows 00
    index = (TOUR / "README.md").read_text(encoding="utf-8")
    for page in [*PAGES, TOUR / "glossary.md"]:
        assert f"]({page.name})" in index, f"docs/tour/README.md does not link {page.name}"


def test_each_page_leads_to_the_next():
    """The last paragraph before a page's exercises links the page that follows it in the
    index, inserted pages (00b, 14b) included, so reading order and file order agree."""
    for page, following in itertools.pairwise(PAGES):
        body = page.read_text(encoding="utf-8").split("\n## Exercises\n", 1)[0]
        last = body.strip().split("\n\n")[-1]
        assert f"]({following.name})" in last, f"{page.name} does not lead to {following.name}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown page."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_links_and_pictures_exist():
    """Every relative link and picture of the tour (code, figures, other pages) exists, and
    so does the heading a link to a tour page names."""
    for page in [*PAGES, TOUR / "README.md", TOUR / "glossary.md"]:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\](?!\([a-z]+:)\(([^)#]*)#?([^)]*)\)", text):
            path = (TOUR / target).resolve() if target else page
            assert path.exists(), f"{page.name}: broken link {target}"
            if anchor and path.parent == TOUR:
                assert anchor in _anchors(path), f"{page.name}: no heading #{anchor} in {path.name}"


def test_the_sample_size_the_pages_give_is_the_samples():
    """Page 16 said "the built-in 100-pair sample" of a sample of 70 pairs."""
    from sample_data import PAIRS

    for page in [*PAGES, TOUR / "README.md"]:
        text = page.read_text(encoding="utf-8")
        for n in re.findall(r"(\d+)-pair sample|sample of (\d+)[^.]*?pairs", text):
            assert int(next(filter(None, n))) == len(PAIRS), f"{page.name}: {n}"


def test_every_page_ends_with_exercises():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "\n## Exercises\n" in text, f"{page.name} has no exercises"
        exercises = text.split("\n## Exercises\n", 1)[1]
        assert len(re.findall(r"^\d\. ", exercises, re.M)) >= 2, page.name


def marked(page: Path):
    """A page that reads Multi30k where it is (multi30k_dir) is marked so that CI runs it
    again with the data hidden."""
    uses_data = "multi30k_dir" in page.read_text(encoding="utf-8")
    return pytest.param(page, marks=pytest.mark.multi30k) if uses_data else page


@pytest.mark.parametrize("page", [marked(p) for p in PAGES], ids=[p.stem for p in PAGES])
def test_tour_page(page: Path, monkeypatch):
    text = page.read_text(encoding="utf-8")
    blocks = python_blocks(text)
    assert blocks, f"{page.name} has no python block"
    monkeypatch.chdir(ROOT)
    threads = torch.get_num_threads()
    namespace: dict = {"__name__": f"tour_{page.stem.replace('-', '_')}"}
    printed: list[str] = []
    start = time.perf_counter()
    try:
        for block in blocks:
            # Padded so a traceback names the page's own line numbers.
            source = "\n" * (block.line - 1) + block.code
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(source, str(page.relative_to(ROOT)), "exec"), namespace)
            printed.append(out.getvalue())
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    if os.environ.get("AIAYN_TOUR_UPDATE"):
        _rewrite_outputs(page, text, blocks, printed)
        blocks = python_blocks(page.read_text(encoding="utf-8"))
    for block, actual in zip(blocks, printed):
        where = f"{page.name}:{block.line}"
        if block.output is None:
            assert not actual.strip(), f"{where} prints, and the page does not show it:\n{actual}"
            continue
        assert actual.strip(), f"{where} has an output block but prints nothing"
        problem = output_mismatch(block.output, actual)
        assert problem is None, (
            f"{where}: {problem}. The page says:\n{block.output}\nThe block printed:\n{actual}"
        )
    # Time is the contract here (a reader runs each page by hand), bounded generously: the
    # slowest page takes ~10 s on one core; a machine shared with other work may be 5x
    # slower. A page that trains for minutes is what this catches.
    limit = float(os.environ.get("AIAYN_TOUR_PAGE_LIMIT_S", "120"))
    assert seconds < limit, f"{page.name} took {seconds:.1f}s (limit {limit:.0f}s)"


def _rewrite_outputs(page: Path, text: str, blocks: list[Block], printed: list[str]) -> None:
    """AIAYN_TOUR_UPDATE=1: write what each block printed into its output block, keeping
    those that still match (with their ``...``)."""
    edits = []  # (start, end, replacement), applied back to front
    for block, actual in zip(blocks, printed):
        body = actual.rstrip() + "\n"
        if block.output is not None:
            if actual.strip() and output_mismatch(block.output, actual) is None:
                continue
            start, end = block.output_span
            if not actual.strip():  # remove the fence too
                start, end = text.rindex("```output", 0, start), text.index("```", end) + 3
                edits.append((start, end + 1, ""))
            else:
                edits.append((start, end, body))
        elif actual.strip():
            edits.append((block.end, block.end, f"\n\n```output\n{body}```"))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    page.write_text(text, encoding="utf-8")


def test_decoding_pictures_match_their_model(sample_model_dir):
    """decoding.txt, which page 15 prints beside decoding_steps.png and beam_tree.png, is
    what docs/figures/generation.py finds on the sample model today: a change to greedy or
    beam search that moves the pictures fails here, not silently. (generation.py also
    asserts that its own search agrees with greedy and beam_search.)"""
    import sys

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from aiayn.checkpoint import load_model

    sys.path.insert(0, str(FIGURES))
    import generation

    model, tokenizer = load_model(sample_model_dir() / "checkpoint_best.pt")
    drawn: list[str] = []

    def out(fig, name):
        plt.close(fig)
        drawn.append(name)

    facts = generation.decoding_steps(out, model.eval(), tokenizer)
    facts += generation.beam_tree(out, model, tokenizer)
    assert drawn == ["decoding_steps.png", "beam_tree.png"]
    expected = (FIGURES / "decoding.txt").read_text(encoding="utf-8")
    problem = output_mismatch(expected, "\n".join(facts))
    assert problem is None, f"decoding.txt: {problem}; now:\n" + "\n".join(facts)
