"""One error family: what the library raises, what the CLI shows, and inputs that used to
get the wrong answer (alpha nan, invalid UTF-8 on stdin, cuda without CUDA, recipe fields
out of range, a train refused after it had written, a finished run resumed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from aiayn import errors
from aiayn.checkpoint import load_checkpoint, load_model, resolve_checkpoint, resolve_device
from aiayn.cli import main
from aiayn.errors import AiaynError, RecipeError
from aiayn.train.recipe import Recipe

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "aiayn"
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def test_every_error_class_derives_from_aiayn_error():
    classes = [c for c in vars(errors).values() if isinstance(c, type)]
    assert len(classes) >= 6 and AiaynError in classes
    for cls in classes:
        assert issubclass(cls, AiaynError) and issubclass(cls, ValueError), cls


def _raised_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal inside a ``raise`` statement."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found.append((node.lineno, part.value))
    return found


def test_library_messages_name_no_command_line_flags():
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "cli"  # the CLI may name its own flags
        for line, text in _raised_strings(path)
        if FLAG.search(text)
    ]
    assert offenders == []
    assert FLAG.search("give --force") and not FLAG.search("x-->y, a --")  # the check bites


def test_alpha_nan_is_refused_with_a_clear_line(sample_model_dir, tmp_path, capsys):
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    model = str(sample_model_dir(False))
    for alpha in ("nan", "-1"):
        assert main(["translate", "--model", model, "--quiet", "--alpha", alpha, str(src)]) == 2
        err = capsys.readouterr().err
        assert "alpha must be a finite number >= 0" in err and "Traceback" not in err


def test_cuda_on_a_machine_without_cuda_says_so(sample_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = resolve_checkpoint(sample_model_dir(False))
    with pytest.raises(AiaynError, match="device cuda: this machine has no CUDA GPU"):
        load_model(path, device="cuda")
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    model = str(sample_model_dir(False))
    assert main(["translate", "--model", model, "--quiet", "--device", "cuda", str(src)]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "corrupt" not in err
    with pytest.raises(AiaynError, match="not a device name"):
        resolve_device("gpu0")
    assert resolve_device("auto") == torch.device("cpu")


def test_a_bug_keeps_its_traceback(sample_model_dir, tmp_path, monkeypatch):
    """Only AiaynError becomes a one-line message; anything else propagates."""
    from aiayn import translator

    def broken(*args, **kwargs):
        raise RuntimeError("a bug, not a user error")

    monkeypatch.setattr(translator.Translator, "translations", broken)
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["translate", "--model", str(sample_model_dir(False)), "--quiet", str(src)])


def test_output_that_cannot_be_written_is_a_clear_error(sample_model_dir, tmp_path, capsys):
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    out = tmp_path / "no" / "such" / "dir" / "out.en"
    model = str(sample_model_dir(False))
    assert main(["translate", "--model", model, "--quiet", str(src), "-o", str(out)]) == 2
    assert "out.en: cannot write" in capsys.readouterr().err


def _one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_evaluate_refuses_files_of_unequal_line_counts(sample_model_dir, tmp_path, capsys):
    src, ref = tmp_path / "in.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\nZwei Katzen.\nEin Mann.\n", encoding="utf-8")
    ref.write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet"]
    err = _one_line_error([*argv, "--src", str(src), "--ref", str(ref)], capsys)
    assert f"{src} has 3 lines but {ref} has 2" in err


def test_average_refuses_last_0_and_no_checkpoints(sample_model_dir, tmp_path, capsys):
    model = sample_model_dir()  # a best checkpoint only: no epoch or step checkpoints
    for last in ("0", "-2"):
        err = _one_line_error(["average", "--model", str(model), "--last", last], capsys)
        assert f"--last must be >= 1, got {last}" in err
    err = _one_line_error(["average", "--model", str(model), "--last", "5"], capsys)
    assert f"{model}: no checkpoint_epoch*.pt or checkpoint_step*.pt to average" in err
    assert not (model / "checkpoint_averaged.pt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no checkpoint_epoch" in _one_line_error(["average", "--model", str(empty)], capsys)


# A model that trains an update in milliseconds, on the built-in sample (no Multi30k).
TINY_RUN = [
    *("model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32"),
    *("model.max_len=64", "max_tokens=400", "warmup=2", "threads=1", "device=cpu"),
]


@pytest.fixture(scope="module")
def sample_prepared(tmp_path_factory) -> Path:
    """The built-in sample pairs, prepared (a 120-token tokenizer)."""
    from aiayn.data.prepared import prepare
    from sample_data import write_sample

    root = tmp_path_factory.mktemp("sample")
    text = write_sample(root / "text")
    train, valid = (text["train.de"], text["train.en"]), (text["val.de"], text["val.en"])
    prepare(train, valid, root / "prepared", vocab_size=120, show_progress=False)
    return root / "prepared"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("adam_betas: [0.9]\n", "'adam_betas' must be two numbers in [0, 1), got [0.9]"),
        ("adam_betas: [0.9, 1.5]\n", "'adam_betas' must be two numbers in [0, 1)"),
        ("update_freq: 0\n", "field 'update_freq' must be >= 1, got 0"),
        ("keep_last: -1\n", "field 'keep_last' must be >= 0, got -1"),
        ("max_tokens: -5\n", "field 'max_tokens' must be >= 1, got -5"),
        ("label_smoothing: 1.5\n", "field 'label_smoothing' must be in [0, 1), got 1.5"),
        ("max_steps: 2.5\n", "field 'max_steps' must be int (a whole number), got 2.5"),
        ("max_steps: true\n", "field 'max_steps' must be int, got True"),
        ("clip_norm: -1\n", "field 'clip_norm' must be >= 0, got -1.0"),
        ("lr_scale: .nan\n", "field 'lr_scale' must be a finite number, got nan"),
        ("adam_eps: .inf\n", "field 'adam_eps' must be a finite number, got inf"),
        ("schedule: linear\n", "schedule 'linear' decays to 0 at the end of the run"),
        ("data:\n", "field 'data' must be a string, got None"),
        ("seed: 1\nmax_steps: 3\nseed: 2\n", ", line 3: key 'seed' given twice (first on line 1)"),
        ("model:\n  d_model: 8\n  d_model: 16\n", ", line 3: key 'd_model' given twice"),
        ("", ": holds no recipe"),
        ("# all commented out\n", ": holds no recipe"),
    ],
)
def test_a_recipe_out_of_type_or_range_names_its_file_and_field(tmp_path, text, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as raised:
        Recipe.from_yaml(path)
    assert str(raised.value).startswith(str(path)) and message in str(raised.value)


def test_recipe_values_at_their_edges_and_overrides(tmp_path):
    """0 keeps its documented meaning (no clipping, no limit, none kept); a whole float is
    an int; an override names itself; a binary file is not taken for a recipe."""
    path = tmp_path / "ok.yaml"
    path.write_text("clip_norm: 0\nmax_steps: 3.0\nkeep_last: 0\nadam_eps: 1e-8\n")
    recipe = Recipe.from_yaml(path, ["adam_betas=[0, 0.5]", "seed=-3"])
    assert (recipe.clip_norm, recipe.max_steps, recipe.keep_last) == (0.0, 3, 0)
    assert recipe.adam_eps == 1e-8 and recipe.adam_betas == (0.0, 0.5) and recipe.seed == -3
    assert isinstance(recipe.max_steps, int)
    with pytest.raises(RecipeError, match=r"^override 'update_freq=0': field 'update_freq'"):
        Recipe().override(["update_freq=0"])
    with pytest.raises(RecipeError, match="'adam_betas' must be two numbers"):
        Recipe().override(["adam_betas=abc"])
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"PK\x03\x04\xff\xfe\x00binary")
    with pytest.raises(RecipeError, match=r"model\.pt: not UTF-8 text"):
        Recipe.from_yaml(binary)
    recipe.keep_last = -1  # set in code: the trainer checks the recipe again
    with pytest.raises(RecipeError, match=r"^recipe: field 'keep_last' must be >= 0"):
        recipe.check()


def test_a_refused_train_writes_nothing_and_keeps_what_was_there(tmp_path, sample_prepared, capsys):
    """Refused before any update: an existing folder keeps its files (no recipe.yaml or
    spm.model overwritten), a new one is not left behind, an --out that is a file or
    cannot be made is named, and --data with --train-src is refused."""
    keep = tmp_path / "run_keep"
    keep.mkdir()
    (keep / "recipe.yaml").write_text("mine\n")
    argv = ["train", "--data", str(sample_prepared), "--no-progress", "--set", *TINY_RUN]
    for bad in ("update_freq=0", "model.n_heads=3", "model.no_such_field=1"):
        _one_line_error([*argv, bad, "--out", str(keep)], capsys)
        assert [p.name for p in keep.iterdir()] == ["recipe.yaml"], bad
        assert (keep / "recipe.yaml").read_text() == "mine\n"
    new = tmp_path / "new" / "run"
    err = _one_line_error([*argv, "--out", str(new), "--init-from", str(tmp_path / "no")], capsys)
    assert "no such model directory" in err and not (tmp_path / "new").exists()
    plain = tmp_path / "existing.txt"
    plain.write_text("a file\n")
    assert f"{plain}: not a directory" in _one_line_error([*argv, "--out", str(plain)], capsys)
    err = _one_line_error([*argv, "--out", str(plain / "run")], capsys)
    assert f"{plain / 'run'}: cannot create the run directory" in err
    err = _one_line_error([*argv, "--out", str(new), "--train-src", str(plain)], capsys)
    assert "--data and --train-src name two data sets" in err and not new.parent.exists()


def test_resume_keeps_the_model_and_a_finished_run_stays_finished(
    tmp_path, sample_prepared, capsys
):
    out = tmp_path / "run"
    argv = ["train", "--data", str(sample_prepared), "--out", str(out), "--no-progress"]
    argv += ["--set", *TINY_RUN]
    assert main([*argv, "max_steps=2"]) == 0
    last = out / "checkpoint_last.pt"
    saved = last.read_bytes()
    capsys.readouterr()
    assert main([*argv, "max_steps=2", "--resume"]) == 0  # nothing more, not step 3
    assert "nothing to do: the run already reached its max_steps" in capsys.readouterr().out
    assert last.read_bytes() == saved
    err = _one_line_error([*argv, "max_steps=3", "model.d_model=32", "--resume"], capsys)
    assert "model.d_model=32 differs from the run being resumed" in err and "d_model=16" in err
    err = _one_line_error([*argv, "max_steps=3", "adam_betas=[0.8,0.98]", "--resume"], capsys)
    assert "adam_betas=[0.8, 0.98] differs from the run being resumed" in err
    assert last.read_bytes() == saved
    assert main([*argv, "max_steps=3", "model.n_heads=2", "--resume"]) == 0  # the same: fine
    assert load_checkpoint(last)["step"] == 3
