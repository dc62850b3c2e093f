"""MkDocs hooks (mkdocs.yml `hooks:`): the site is built from the files as they are.

Pages written for GitHub link files outside docs/ (the tour links the code it explains,
`../../src/aiayn/model/attention.py`; BENCHMARKS.md sits at the repository root). On the
site those links would lead nowhere, so:

- BENCHMARKS.md becomes the page benchmarks.md, its links made relative to docs/;
- a link to the README goes to the home page, and one to a folder of the repository (the
  tour's `../../src/aiayn/model/`) to the architecture page, which says what each holds;
- every other repository file a page links to is copied into the site under source/ and
  the link pointed there. A link to a file that does not exist is left alone, so the
  strict build reports it as broken.

No page is edited on disk; the tour's pages are built exactly as written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
SOURCE = "source"
BENCHMARKS = "BENCHMARKS.md"
PAGES = {BENCHMARKS: "benchmarks.md", "README.md": "index.md"}  # root file -> site page
FOLDERS = "architecture.md"


def _root(config: Any) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def _outside_target(page_dir: Path, target: str, docs: Path, root: Path) -> Path | None:
    """The repository file a relative link leaves docs/ for, or None."""
    if "://" in target or target.startswith(("#", "mailto:", "/")):
        return None
    path = (page_dir / target.split("#", 1)[0]).resolve()
    if path.is_relative_to(docs) or not path.is_relative_to(root) or not path.exists():
        return None
    return path


def _benchmarks_markdown(root: Path) -> str:
    """BENCHMARKS.md with its links made relative to docs/."""
    text = (root / BENCHMARKS).read_text(encoding="utf-8")

    def rebase(m: re.Match[str]) -> str:
        target = m.group(2)
        if "://" in target or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        new = os.path.relpath(root / path, root / "docs")
        return f"{m.group(1)}{new}{'#' + anchor if anchor else ''}{m.group(3)}"

    return LINK.sub(rebase, text)


def on_files(files: Files, config: Any) -> Files:
    docs, root = Path(config["docs_dir"]).resolve(), _root(config)
    files.append(File.generated(config, "benchmarks.md", content=_benchmarks_markdown(root)))
    wanted: set[Path] = set()
    pages = [
        (Path(f.abs_src_path).parent, Path(f.abs_src_path).read_text(encoding="utf-8"))
        for f in files.documentation_pages()
        if f.abs_src_path
    ]
    pages.append((docs, _benchmarks_markdown(root)))
    for page_dir, text in pages:
        for m in LINK.finditer(text):
            path = _outside_target(page_dir, m.group(2), docs, root)
            if path is None or not path.is_file():
                continue
            if path.parent != root or path.name not in PAGES:
                wanted.add(path)
    for path in sorted(wanted):
        uri = f"{SOURCE}/{path.relative_to(root).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    docs, root = Path(config["docs_dir"]).resolve(), _root(config)
    page_dir = (docs / page.file.src_uri).parent

    def relink(m: re.Match[str]) -> str:
        target = m.group(2)
        path = _outside_target(page_dir, target, docs, root)
        if path is None:
            return m.group(0)
        anchor = target.partition("#")[2]
        if path.parent == root and path.name in PAGES:
            dest = docs / PAGES[path.name]
        elif path.is_dir():
            dest, anchor = docs / FOLDERS, ""
        else:
            dest = docs / SOURCE / path.relative_to(root)
        new = os.path.relpath(dest, page_dir) + (f"#{anchor}" if anchor else "")
        return f"{m.group(1)}{new}{m.group(3)}"

    return LINK.sub(relink, markdown)
