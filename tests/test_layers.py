"""The package's dependency contract: layers import only from layers to their left.

    errors -> {config, metrics, progress, distributed} -> model -> {decode, quantize, tour}
    -> data -> checkpoint -> translator -> train -> inspect -> {export, serve, marian} -> cli

Checked on the source (every import statement, also those inside functions), so a change
that makes inference depend on training, or the model on data, fails `make test`.
Modules on one layer are independent of each other (like import-linter's "a | b").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "aiayn"
LAYERS = [
    {"errors"},
    {"config", "metrics", "progress", "distributed"},
    {"model"},
    {"decode", "quantize", "tour"},  # tour: the learner's checkers of docs/tour
    {"data"},
    {"checkpoint"},
    {"translator"},
    {"train"},
    {"inspect"},  # attention maps: the server's too
    {"export", "serve", "marian"},
    {"cli"},
    {"__main__"},  # python -m aiayn: the CLI
]
LAYER_OF = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def component(module: str) -> str:
    """aiayn.decode.beam -> decode; aiayn -> "" (the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every aiayn import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = (
        module_name(path)
        if path.name == "__init__.py"
        else module_name(path)[: -len(path.stem) - 1]
    )
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("aiayn")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("aiayn"):
                found.append((node.lineno, name))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def violations(paths=SOURCES) -> list[str]:
    bad = []
    for path in paths:
        here = component(module_name(path))
        if here == "":  # aiayn/__init__.py re-exports the public names
            continue
        if here not in LAYER_OF:
            bad.append(f"{path.relative_to(PACKAGE)}: module {here!r} has no layer in the contract")
            continue
        for line, target in imported_modules(path):
            there = component(target)
            if there == here:
                continue
            if there == "" or there not in LAYER_OF:
                bad.append(f"{path.relative_to(PACKAGE)}:{line} imports {target} (no layer)")
            elif LAYER_OF[there] >= LAYER_OF[here]:
                bad.append(
                    f"{path.relative_to(PACKAGE)}:{line}: {here} (layer {LAYER_OF[here]}) "
                    f"imports {target} (layer {LAYER_OF[there]})"
                )
    return bad


def test_every_import_points_left():
    assert SOURCES, f"no sources found under {PACKAGE}"
    assert violations() == []


@pytest.mark.parametrize(
    ("where", "source", "complaint"),
    [
        ("translator.py", "from aiayn.train.trainer import Trainer\n", "translator (layer 6)"),
        ("model/masks.py", "def f():\n    from aiayn.data import pad\n", "model (layer 2)"),
        ("decode/x.py", "import aiayn.quantize\n", "decode (layer 3) imports aiayn.quantize"),
        ("data/x.py", "from ..checkpoint import LAST\n", "imports aiayn.checkpoint"),
        ("extra.py", "import os\n", "has no layer"),
    ],
)
def test_the_contract_catches_a_wrong_import(tmp_path, monkeypatch, where, source, complaint):
    fake = tmp_path / "aiayn"
    path = fake / where
    path.parent.mkdir(parents=True)
    path.write_text(source, encoding="utf-8")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    found = violations([path])
    assert len(found) == 1 and complaint in found[0], found
