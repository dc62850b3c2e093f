"""Checkpoints that cannot be used, refused with one line naming the file: damaged entries,
averages of checkpoints of another tokenizer or other weights, an average written over
something that is not a file, and a model spec that names no checkpoint."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import torch

from aiayn.checkpoint import load_checkpoint
from aiayn.cli import main
from cli_util import one_line_error


def _epochs(sample_model_dir, folder: Path, last: dict) -> Path:
    """A model directory of two epoch checkpoints of the sample model, the second one's
    entries changed by ``last`` (None removes an entry)."""
    from aiayn.checkpoint import BEST, save_checkpoint

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
    other = "checkpoint_epoch002.pt has another tokenizer than "
    cases = [
        (other, {"tokenizer": english.to_bytes()}),
        (other, {"tokenizer": None}),  # none, beside one that has one
        ("checkpoint_epoch002.pt: checkpoint entry 'tokenizer': not a valid", {"tokenizer": b"x"}),
        ("checkpoint_epoch002.pt: checkpoint entry 'model' is malformed (an int", {"model": 5}),
        (
            "checkpoint_epoch002.pt: no weight 'src_embed.weight'",
            {"model": {k: v for k, v in weights.items() if k != "src_embed.weight"}},
        ),
    ]
    for i, (message, last) in enumerate(cases):
        model = _epochs(sample_model_dir, tmp_path / str(i), last)
        err = one_line_error(["average", "--model", str(model), "--last", "2"], capsys)
        assert message in err, err
        if i < 2:  # the message names both files, as translate's ensemble check does
            assert f"than {model / 'checkpoint_epoch001.pt'}; averaged checkpoints" in err
        assert not (model / "checkpoint_averaged.pt").exists()


def test_average_refuses_an_out_that_is_no_regular_file(sample_model_dir, tmp_path, capsys):
    model = _epochs(sample_model_dir, tmp_path / "model", {})
    folder, fifo, file = tmp_path / "adir", tmp_path / "fifo", tmp_path / "file"
    folder.mkdir()
    os.mkfifo(fifo)
    file.write_text("kept")
    argv = ["average", "--model", str(model), "--out"]
    assert f"{folder}: is a directory" in one_line_error([*argv, str(folder)], capsys)
    assert f"{fifo}: not a regular file" in one_line_error([*argv, str(fifo)], capsys)
    err = one_line_error([*argv, str(file / "avg.pt")], capsys)
    assert f"{file / 'avg.pt'}: cannot write (" in err
    assert folder.is_dir() and not any(folder.iterdir()) and stat.S_ISFIFO(fifo.stat().st_mode)
    assert file.read_text() == "kept"
    assert main([*argv, str(tmp_path / "new" / "avg.pt")]) == 0  # the same run, a good --out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "fifo", "file", "model", "new"]


def test_average_never_replaces_the_tokenizer_recipe_or_metrics(sample_model_dir, tmp_path, capsys):
    """`average --out model/spm.model` replaced the tokenizer with a checkpoint (rc 0),
    where `translate -o model/spm.model` is refused as a file of the model."""
    model = _epochs(sample_model_dir, tmp_path / "model", {})
    argv = ["average", "--model", str(model), "--out"]
    for name in ("spm.model", "recipe.yaml", "metrics.jsonl", "config.json"):
        kept = model / name
        if not kept.exists():
            kept.write_text("kept")
        before = kept.read_bytes()
        err = one_line_error([*argv, str(kept)], capsys)
        assert f"{kept}: a model's tokenizer, recipe or metrics file" in err
        assert kept.read_bytes() == before


def test_a_damaged_checkpoint_is_one_line_naming_it(sample_model_dir, tmp_path, capsys):
    from aiayn.checkpoint import BEST, save_checkpoint

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
            assert f"{path}: {message}" in one_line_error(argv, capsys)


def test_a_device_given_as_checkpoint_or_recipe_is_not_called_missing(
    sample_model_dir, tmp_path, capsys
):
    """/dev/null (or a pipe) exists: "no such checkpoint file" sent a user looking for it."""
    model = str(sample_model_dir())
    for argv, message in (
        (["summary", "--model", model, "--checkpoint", "/dev/null"], "checkpoint file"),
        (["train", "--config", "/dev/null", "--out", str(tmp_path / "run")], "recipe file"),
    ):
        err = one_line_error(argv, capsys)
        assert "/dev/null: not a regular file" in err and message not in err, err


def test_a_path_too_long_or_a_loop_of_links_is_one_line(sample_model_dir, tmp_path, capsys):
    """Path.is_dir() raises ENAMETOOLONG and the like on Python 3.11: tracebacks."""
    long = str(tmp_path / ("x" * 300))
    model = str(sample_model_dir())
    for argv in (["summary", "--model", long], ["plot", "--run", long]):
        err = one_line_error(argv, capsys)
        assert long in err and ": File name too long" in err, err
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    src = tmp_path / "in.de"
    src.write_text("Ein Hund.\n", encoding="utf-8")
    out = str(tmp_path / "loop")
    err = one_line_error(["translate", "--model", model, "-o", out, "--quiet", str(src)], capsys)
    assert f"{out}: Too many levels of symbolic links" in err


def test_weights_saved_from_a_wrapper_are_named_in_short(sample_model_dir, tmp_path, capsys):
    """Weights saved from DDP's wrapper (every name "module."-prefixed) gave torch's whole
    list of missing names, 2.5 KB, and never the prefix that explains it."""
    from aiayn.checkpoint import BEST, save_checkpoint

    state = load_checkpoint(sample_model_dir() / BEST)
    wrapped = {f"module.{name}": tensor for name, tensor in state["model"].items()}
    path = save_checkpoint({**state, "model": wrapped}, tmp_path / "ddp.pt")
    err = one_line_error(["summary", "--model", str(tmp_path), "--checkpoint", str(path)], capsys)
    assert f"{path}: weights do not fit the model config (Missing key(s)" in err
    assert '"module.src_embed.weight"' in err and len(err) < 600, err


def test_a_checkpoint_it_may_not_read_is_not_called_corrupt(sample_model_dir, capsys, monkeypatch):
    """ "cannot read checkpoint, the file is truncated or corrupt (PermissionError)" sent a
    user to delete a good file. Root reads any file: the refusal is simulated."""

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(torch, "load", refuse)
    path = sample_model_dir() / "checkpoint_best.pt"
    err = one_line_error(["summary", "--model", str(sample_model_dir())], capsys)
    assert f"{path}: cannot read (Permission denied)" in err and "corrupt" not in err


def test_train_init_from_a_directory_and_no_checkpoint_name(sample_model_dir, tmp_path, capsys):
    """``--init-from DIR:`` used to say "{'DIR'/ None}: no such checkpoint file"."""
    files = [f"--{k}={tmp_path / k}" for k in ("train-src", "train-tgt", "valid-src", "valid-tgt")]
    model = sample_model_dir()
    argv = ["train", "--out", str(tmp_path / "run"), *files, "--no-progress", "--init-from"]
    err = one_line_error([*argv, f"{model}:"], capsys)
    assert f"'{model}:' names no checkpoint after ':'" in err and "{" not in err, err
