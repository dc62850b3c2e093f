"""The scripts beside the library (benchmarks/, docs/figures/, docs/tools/) import names
that the library still has: no test runs most of them (they train for an hour or need a
GPU), so a name moved in the library broke `make bleu` without a failing test."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    path.relative_to(ROOT)
    for folder in ("benchmarks", "docs/figures", "docs/tools")
    for path in (ROOT / folder).rglob("*.py")
)


def _aiayn_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) of every ``from aiayn... import name`` and (module, None) of every
    ``import aiayn...`` in the file, at any depth (imports inside functions too)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiayn":
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "aiayn"]
    return found


def test_the_scripts_are_found():
    names = {str(path) for path in SCRIPTS}
    assert {"benchmarks/multi30k_bleu.py", "benchmarks/distill.py"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_every_library_name_a_script_imports_exists(script):
    for module, name in _aiayn_imports(ROOT / script):
        imported = importlib.import_module(module)
        if name is not None and name != "*":
            assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), (
                f"{script}: `from {module} import {name}`: {module} has no {name}"
            )
