"""One error family: what the library raises (every error an AiaynError, no message naming
a command-line flag), what the CLI shows (one line, exit 2; a bug keeps its traceback), and
inputs that used to get the wrong answer (alpha nan, cuda without CUDA, unequal line
counts)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from aiayn import errors
from aiayn.checkpoint import load_model, resolve_checkpoint, resolve_device
from aiayn.cli import main
from aiayn.errors import AiaynError
from cli_util import one_line_error

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
    assert f"-o {out}: no folder {out.parent} to write it in" in capsys.readouterr().err


def test_evaluate_refuses_files_of_unequal_line_counts(sample_model_dir, tmp_path, capsys):
    src, ref = tmp_path / "in.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\nZwei Katzen.\nEin Mann.\n", encoding="utf-8")
    ref.write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(sample_model_dir()), "--quiet"]
    err = one_line_error([*argv, "--src", str(src), "--ref", str(ref)], capsys)
    assert f"{src} has 3 line(s) but {ref} has 2" in err


def test_average_refuses_last_0_and_no_checkpoints(sample_model_dir, tmp_path, capsys):
    model = sample_model_dir()  # a best checkpoint only: no epoch or step checkpoints
    for last in ("0", "-2"):
        err = one_line_error(["average", "--model", str(model), "--last", last], capsys)
        assert f"--last must be >= 1, got {last}" in err
    err = one_line_error(["average", "--model", str(model), "--last", "5"], capsys)
    assert f"{model}: no checkpoint_epoch*.pt or checkpoint_step*.pt to average" in err
    assert not (model / "checkpoint_averaged.pt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no checkpoint_epoch" in one_line_error(["average", "--model", str(empty)], capsys)
    for missing in (tmp_path / "nope", tmp_path / "nope" / "run"):  # not "cannot write" --out
        err = one_line_error(["average", "--model", str(missing)], capsys)
        assert f"{missing}: no such model directory" in err


def test_a_checkpoint_file_given_as_the_model_is_not_called_missing(
    sample_model_dir, tmp_path, capsys
):
    """``--model run/checkpoint_best.pt`` said "no such model directory" of a file that
    is there; it is "not a model directory" now, in every command that takes a model."""
    checkpoint = sample_model_dir() / "checkpoint_best.pt"
    (tmp_path / "in.de").write_text("ein Hund\n")
    for argv in (
        ["translate", "--model", str(checkpoint), str(tmp_path / "in.de")],
        ["average", "--model", str(checkpoint)],
        ["attention", "--model", str(checkpoint), "ein Hund"],
    ):
        err = one_line_error(argv, capsys)
        assert f"{checkpoint}: not a model directory" in err, (argv, err)


def test_a_device_torch_parses_but_cannot_use_is_refused(monkeypatch):
    """cpu:1 and mps (without MPS) got through and failed at loading as a corrupt checkpoint."""
    assert resolve_device("cpu:0") == torch.device("cpu")
    with pytest.raises(AiaynError, match=r"^device cpu:1: the CPU has no index; use cpu$"):
        resolve_device("cpu:1")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(AiaynError, match="device mps: this machine has no MPS device"):
        resolve_device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("mps") == torch.device("mps")


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "marian", "--model", "a", "--model", "b", "--out", "x"],
        ["export", "ctranslate2", "--model", "a", "--model", "b", "--out", "x"],
        ["average", "--model", "a", "--model", "b"],
        ["attention", "--model", "a", "--checkpoint", "best", "--checkpoint", "last", "Ein"],
        ["summary", "--model", "a", "--model", "b"],
    ],
)
def test_a_flag_of_one_model_given_twice_is_refused(argv, capsys):
    """translate, evaluate and serve take --model again as an ensemble; the commands of one
    model let the last --model win, so `export --model A --model B` exported B alone."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "given twice: this command takes one" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags", [["--sampling", "--no-sampling"], ["--no-sampling", "--sampling"]]
)
def test_a_flag_and_its_no_form_together_are_refused(flags, capsys):
    """--sampling --no-sampling let the last win without a word."""
    with pytest.raises(SystemExit) as e:
        main(["translate", "--model", "a", *flags, "in.de"])
    assert e.value.code == 2
    assert "--sampling/--no-sampling: given twice (or with its --no- form)" in (
        capsys.readouterr().err
    )


PREPARE = "prepare --train-src a --train-tgt b --valid-src c --valid-tgt d --out o"


@pytest.mark.parametrize(
    "command",
    [
        "train --out a --out b --data d",
        "train --out a --config r.yaml --config s.yaml",
        "train --out a --data d --data e",
        "train --out a --train-src x --train-src y",
        "train --out a --data d --init-from m --init-from n",
        "train --out a --data d --resume --resume auto",
        f"{PREPARE} --train-src e",
        f"{PREPARE} --out p",
        f"{PREPARE} --vocab-size 100 --vocab-size 200",
        "average --model m --out a.pt --out b.pt",
        "average --model m --last 2 --last 3",
        "demo --steps 1 --steps 2 --min-accuracy 2",
        # every command's flags of one value, by one rule (cli._once_each)
        "translate --model m -o a -o b",
        "translate --model m --beam 2 --beam 3",
        "evaluate --model m --src a --src b --ref r",
        "plot --run r --out a --out b",
        "serve --model m --port 1 --port 2",
        "data get multi30k --mirror a --mirror b",
        "export ctranslate2 --model m --out a --out b",
        "import marian f --out a --out b",
        "attention --model m x --layer 1 --layer 2",
    ],
)
def test_a_flag_of_one_value_given_twice_is_refused(command, capsys, tmp_path, monkeypatch):
    """`train --out A --out B` trained into B, `--config` twice read the last recipe alone,
    and so on: argparse lets the last win without a word."""
    monkeypatch.chdir(tmp_path)  # the relative paths above name nothing there
    with pytest.raises(SystemExit) as e:
        main(command.split())
    assert e.value.code == 2
    assert "given twice: this command takes one" in capsys.readouterr().err
