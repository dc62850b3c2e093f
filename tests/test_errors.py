"""One error family: what the library raises, what the CLI shows, and three inputs that
used to get the wrong answer (alpha nan, invalid UTF-8 on stdin, cuda without CUDA)."""

from __future__ import annotations

import ast
import os
import re
import stat
from pathlib import Path

import pytest
import torch

from aiayn import errors
from aiayn.checkpoint import load_model, resolve_checkpoint, resolve_device
from aiayn.cli import main
from aiayn.errors import AiaynError

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


def _epochs(sample_model_dir, folder: Path, last: dict) -> Path:
    """A model directory of two epoch checkpoints of the sample model, the second one's
    entries changed by ``last`` (None removes an entry)."""
    from aiayn.checkpoint import BEST, load_checkpoint, save_checkpoint

    state = load_checkpoint(sample_model_dir() / BEST)
    save_checkpoint(state, folder / "checkpoint_epoch001.pt")
    changed = {k: v for k, v in {**state, **last}.items() if v is not None}
    save_checkpoint(changed, folder / "checkpoint_epoch002.pt")
    return folder


def test_average_refuses_another_a_missing_or_a_damaged_tokenizer(
    sample_model_dir, tmp_path, capsys
):
    from aiayn.data.tokenizer import Tokenizer
    from sample_data import PAIRS

    english = Tokenizer.train([en for _, en in PAIRS], tmp_path / "en", 160, num_threads=1)
    weights = torch.load(sample_model_dir() / "checkpoint_best.pt", weights_only=True)["model"]
    cases = {
        "checkpoint_epoch002.pt has another tokenizer than ": {"tokenizer": english.to_bytes()},
        "checkpoint_epoch002.pt: checkpoint holds no tokenizer": {"tokenizer": None},
        "checkpoint_epoch002.pt: checkpoint entry 'tokenizer': not a valid": {"tokenizer": b"x"},
        "checkpoint_epoch002.pt: checkpoint entry 'model' is malformed (an int": {"model": 5},
        "checkpoint_epoch002.pt: no weight 'src_embed.weight'": {
            "model": {k: v for k, v in weights.items() if k != "src_embed.weight"}
        },
    }
    for i, (message, last) in enumerate(cases.items()):
        model = _epochs(sample_model_dir, tmp_path / str(i), last)
        err = _one_line_error(["average", "--model", str(model)], capsys)
        assert message in err, err
        if i == 0:  # the message names both files, as translate's ensemble check does
            assert f"than {model / 'checkpoint_epoch001.pt'}; averaged checkpoints" in err
        assert not (model / "checkpoint_averaged.pt").exists()


def test_average_refuses_an_out_that_is_no_regular_file(sample_model_dir, tmp_path, capsys):
    model = _epochs(sample_model_dir, tmp_path / "model", {})
    folder, fifo, file = tmp_path / "adir", tmp_path / "fifo", tmp_path / "file"
    folder.mkdir()
    os.mkfifo(fifo)
    file.write_text("kept")
    argv = ["average", "--model", str(model), "--out"]
    assert f"{folder}: is a directory" in _one_line_error([*argv, str(folder)], capsys)
    assert f"{fifo}: not a regular file" in _one_line_error([*argv, str(fifo)], capsys)
    err = _one_line_error([*argv, str(file / "avg.pt")], capsys)
    assert f"{file / 'avg.pt'}: cannot write (" in err
    assert folder.is_dir() and not any(folder.iterdir()) and stat.S_ISFIFO(fifo.stat().st_mode)
    assert file.read_text() == "kept"
    assert main([*argv, str(tmp_path / "new" / "avg.pt")]) == 0  # the same run, a good --out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "fifo", "file", "model", "new"]


def test_a_damaged_checkpoint_is_one_line_naming_it(sample_model_dir, tmp_path, capsys):
    from aiayn.checkpoint import BEST, load_checkpoint, save_checkpoint

    state = load_checkpoint(sample_model_dir() / BEST)
    nan = {k: torch.full_like(v, float("nan")) for k, v in state["model"].items()}
    cases = {
        "checkpoint entry 'config' is malformed (a str": {"config": "hello"},
        "checkpoint entry 'model' is malformed (an int": {"model": 5},
        "TransformerConfig.n_heads: d_model=64 is not divisible": {
            "config": {**state["config"], "n_heads": 7}
        },
        "TransformerConfig: unknown field(s) wibble": {"config": {**state["config"], "wibble": 3}},
        "weight 'src_embed.weight' holds NaN or infinity": {"model": nan},
    }
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    for message, change in cases.items():
        path = save_checkpoint({**state, **change}, tmp_path / "bad.pt")
        flags = ["--model", str(tmp_path), "--checkpoint", str(path)]
        for argv in (["translate", *flags, "--quiet", str(src)], ["summary", *flags]):
            assert f"{path}: {message}" in _one_line_error(argv, capsys)


def test_train_init_from_a_directory_and_no_checkpoint_name(sample_model_dir, tmp_path, capsys):
    """``--init-from DIR:`` used to say "{'DIR'/ None}: no such checkpoint file"."""
    files = [f"--{k}={tmp_path / k}" for k in ("train-src", "train-tgt", "valid-src", "valid-tgt")]
    model = sample_model_dir()
    argv = ["train", "--out", str(tmp_path / "run"), *files, "--no-progress", "--init-from"]
    err = _one_line_error([*argv, f"{model}:"], capsys)
    assert f"'{model}:' names no checkpoint after ':'" in err and "{" not in err, err
