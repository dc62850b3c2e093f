"""benchmarks/gpu_check.py (issue 43): its CPU smoke run, from a checkout with only
PYTHONPATH=src, and its plain word on what is missing; the device defaults of recipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from benchmarks import gpu_check

from aiayn.errors import RecipeError
from aiayn.train.optim import make_optimizer
from aiayn.train.recipe import Recipe, step_settings
from sample_data import ROOT


def test_the_cpu_smoke_run_gives_every_figure(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "check.json"
    argv = [sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--device", "cpu", "--tiny"]
    argv += ["--out", str(out), "--work", str(tmp_path / "work")]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    systems = {(r["model"], r["system"]) for r in report["step"]}
    for model in ("base", "big"):
        for system in ("aiayn eager", "aiayn compiled", "torch.nn.Transformer eager"):
            assert (model, system) in systems
    assert all(r["target_tokens_per_s"] > 0 and r["gflop_per_step"] > 0 for r in report["step"])
    assert [r["system"] for r in report["train"]] == ["aiayn train, eager", "aiayn train, compiled"]
    assert all(r["updates"] == 4 and r["tokens_per_s"] > 0 for r in report["train"])
    assert [r["graphs"] for r in report["train"]] == [0, 1]  # one graph for every length
    assert all(r["first_update_s"] >= 0 for r in report["train"])
    assert [r["decode"] for r in report["decode"]] == ["greedy", "beam 4"]
    assert all(r["sentences_per_s"] > 0 for r in report["decode"])
    assert report["device"] == "cpu" and report["step"][0]["mfu"] is None  # no known peak


def test_a_missing_module_is_named(monkeypatch):
    monkeypatch.setattr(gpu_check, "NEEDED", {"torch": "torch", "no_such_module_43": "nosuch43"})
    with pytest.raises(SystemExit, match=r"missing Python module\(s\): nosuch43"):
        gpu_check.preflight()


def test_precision_and_compile_default_to_the_device(monkeypatch):
    """Unset: bf16 and compiled on CUDA (fp32 where it has no bf16), fp32 and eager on the
    CPU; a value the recipe gives wins everywhere."""
    recipe = Recipe()
    assert step_settings(recipe, "cpu") == {"precision": "fp32", "compile": False}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert step_settings(recipe, "cuda") == {"precision": "bf16", "compile": True}
    given = Recipe.from_dict({"compile": False, "precision": "fp32"})
    assert step_settings(given, "cuda") == {"precision": "fp32", "compile": False}
    assert step_settings(Recipe().override(["compile=true"]), "cpu")["compile"] is True
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert step_settings(recipe, "cuda")["precision"] == "fp32"
    unset = Recipe.from_dict({"compile": None, "precision": None})
    assert (unset.compile, unset.precision) == (None, None)
    with pytest.raises(RecipeError, match="field 'compile' must be true or false or null"):
        Recipe().override(["compile=3"])
    # The recipe shipped for the CPU leaves both unset: its CPU run is as before.
    multi30k = Recipe.from_yaml(ROOT / "recipes/multi30k.yaml")
    assert (multi30k.compile, multi30k.precision) == (None, None)
    # Fused Adam where the parameters are on CUDA only.
    optimizer = make_optimizer(torch.nn.Linear(2, 2))
    assert not optimizer.defaults.get("fused")
