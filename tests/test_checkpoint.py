"""Atomic checkpoints, clear errors for bad ones, averaging, and recipes."""

from __future__ import annotations

import errno
import io
import os
import pickle
import random
import stat
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import (
    CheckpointError,
    check_vocab,
    load_checkpoint,
    save_checkpoint,
    split_model_spec,
)
from aiayn.data.tokenizer import Tokenizer
from aiayn.train.averaging import average_checkpoints
from aiayn.train.recipe import Recipe, RecipeError
from sample_data import PAIRS


def state(value: float, step: int = 1, tokenizer: bytes | None = None) -> dict:
    return {
        "model": {"w": torch.full((2, 3), value), "steps": torch.tensor(step)},
        "config": {"src_vocab_size": 10, "tgt_vocab_size": 10},
        "step": step,
        "optimizer": {"state": {}},
        **({"tokenizer": tokenizer} if tokenizer is not None else {}),
    }


@pytest.fixture(scope="module")
def spm(tmp_path_factory) -> tuple[bytes, bytes]:
    """Two tokenizers of one size, trained on other text (a few milliseconds each)."""
    folder = tmp_path_factory.mktemp("spm")
    both = Tokenizer.train([s for p in PAIRS for s in p], folder / "a", 60, num_threads=1)
    english = Tokenizer.train([p[1] for p in PAIRS], folder / "b", 60, num_threads=1)
    assert both.to_bytes() != english.to_bytes()
    return both.to_bytes(), english.to_bytes()


def test_save_and_load_round_trip(tmp_path):
    path = save_checkpoint(state(1.5), tmp_path / "c.pt")
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], torch.full((2, 3), 1.5))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temp file left behind


def test_crash_mid_save_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(state(1.0), tmp_path / "c.pt")

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(CheckpointError, match=r"c\.pt: cannot write \(disk full\)"):
        save_checkpoint(state(2.0), path)
    monkeypatch.undo()

    class Full(io.FileIO):  # the disk fills up under torch.save, which makes it a RuntimeError
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(fd, "wb"))
    with pytest.raises(CheckpointError, match=r"c\.pt: cannot write \(No space left on device\)"):
        save_checkpoint(state(2.0), path)
    monkeypatch.undo()
    assert load_checkpoint(path)["model"]["w"][0, 0].item() == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_truncated_corrupt_missing_and_foreign_files_give_clear_errors(tmp_path):
    path = save_checkpoint(state(1.0), tmp_path / "c.pt")
    data = path.read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"trunc\.pt: cannot read checkpoint"):
        load_checkpoint(tmp_path / "trunc.pt")
    # Random bytes break torch's unpickler in many different ways: every one must be named.
    for seed in range(200):
        junk = random.Random(seed).randbytes(2000)
        (tmp_path / "junk.pt").write_bytes(junk if seed % 2 else b"\x80\x02" + junk)
        with pytest.raises(CheckpointError, match=r"junk\.pt: cannot read"):
            load_checkpoint(tmp_path / "junk.pt")
    for cut in (1, 100, len(data) - 1):
        (tmp_path / "cut.pt").write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"cut\.pt: cannot read"):
            load_checkpoint(tmp_path / "cut.pt")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"weights": torch.ones(1)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not an aiayn checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")


def test_vocabulary_mismatch_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"vocabulary size \[10\].*8000"):
        check_vocab(state(1.0), 8000, tmp_path / "c.pt", "the tokenizer")


def test_average_is_the_elementwise_mean(tmp_path, spm):
    paths = [
        save_checkpoint(state(v, step=i, tokenizer=spm[0]), tmp_path / f"e{i}.pt")
        for i, v in enumerate([1.0, 2.0, 6.0])
    ]
    avg = average_checkpoints(paths)
    assert torch.allclose(avg["model"]["w"], torch.full((2, 3), 3.0))
    assert avg["model"]["steps"].item() == 0  # integer buffers are copied, not averaged
    assert avg["step"] == 2 and "optimizer" not in avg and avg["tokenizer"] == spm[0]
    other = state(1.0, tokenizer=spm[0])
    other["config"] = {"src_vocab_size": 12, "tgt_vocab_size": 12}
    save_checkpoint(other, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="config differs"):
        average_checkpoints([paths[0], tmp_path / "other.pt"])


def test_average_holds_one_checkpoint_at_a_time(tmp_path, spm, monkeypatch):
    """It loaded every checkpoint at once, optimizer state included: the paper's 20
    checkpoints of a base model held about 16 GB. Now one at a time beside a running
    sum, to the same mean as all at once (float64, in the same order)."""
    import gc
    import weakref

    from aiayn.train import averaging

    torch.manual_seed(0)
    states = [state(1.0, step=i, tokenizer=spm[0]) for i in range(4)]
    for s in states:
        s["model"]["w"] = torch.randn(2, 3)
    paths = [save_checkpoint(s, tmp_path / f"e{i}.pt") for i, s in enumerate(states)]
    alive: list[weakref.ref] = []
    most = []

    def load(path):
        gc.collect()
        most.append(sum(ref() is not None for ref in alive))
        loaded = load_checkpoint(path)
        loaded["optimizer"] = torch.zeros(1000)  # what the state holds besides its weights
        alive.append(weakref.ref(loaded["optimizer"]))
        return loaded

    monkeypatch.setattr(averaging, "load_checkpoint", load)
    avg = average_checkpoints(paths)
    assert most == [0, 0, 0, 0]  # no earlier checkpoint's state is held at any load
    mean = (sum(s["model"]["w"].double() for s in states) / 4).float()
    assert torch.equal(avg["model"]["w"], mean) and avg["step"] == 3


def test_average_refuses_another_tokenizer_none_or_other_weights(tmp_path, spm):
    first = save_checkpoint(state(1.0, tokenizer=spm[0]), tmp_path / "a.pt")
    second = tmp_path / "b.pt"
    good = state(2.0, tokenizer=spm[0])
    weights = good["model"]
    cases = {
        r"has another tokenizer than .*a\.pt": state(2.0, tokenizer=spm[1]),
        r"b\.pt has another tokenizer than .*a\.pt": state(2.0),  # none
        r"b\.pt: no weight 'w' \(as .*a\.pt has\)": {**good, "model": {"steps": weights["steps"]}},
        r"b\.pt: weight 'x' is not in": {**good, "model": {**weights, "x": torch.ones(1)}},
        r"b\.pt: weight 'w' has shape \[3, 2\], but \[2, 3\]": {
            **good,
            "model": {**weights, "w": torch.ones(3, 2)},
        },
    }
    for message, damaged in cases.items():
        save_checkpoint(damaged, second)
        with pytest.raises(CheckpointError, match=message):
            average_checkpoints([first, second])
    save_checkpoint(good, second)
    assert average_checkpoints([first, second])["model"]["w"][0, 0] == 1.5  # the same, fixed
    bare = [save_checkpoint(state(v), tmp_path / f"bare{v}.pt") for v in (1.0, 2.0)]
    assert average_checkpoints(bare)["model"]["w"][0, 0] == 1.5  # weights alone: none has one


def test_recipe_yaml_overrides_and_errors(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train_src: data/a.de\nmax_tokens: 2000\nmodel:\n  d_model: 128\n")
    recipe = Recipe.from_yaml(path, ["max_tokens=1234", "model.n_heads=2", "clip_norm=1"])
    assert recipe.max_tokens == 1234 and recipe.clip_norm == 1.0
    assert recipe.model["d_model"] == 128 and recipe.model["n_heads"] == 2
    assert recipe.model["d_ff"] == 2048  # untouched defaults stay
    assert recipe.train_src == str((tmp_path / "data/a.de").resolve())  # relative to the file
    path.write_text("max_tokns: 5\n")
    with pytest.raises(RecipeError, match=r"unknown field.*max_tokns"):
        Recipe.from_yaml(path)
    path.write_text("max_tokens: lots\n")
    with pytest.raises(RecipeError, match="'max_tokens' must be int"):
        Recipe.from_yaml(path)
    with pytest.raises(RecipeError, match="no such recipe"):
        Recipe.from_yaml(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="expected key=value"):
        Recipe().override(["max_tokens"])
    # Nested hundreds deep: a RecursionError traceback of 3,000 lines.
    path.write_text("max_steps: " + "[" * 1000 + "]" * 1000 + "\n")
    with pytest.raises(RecipeError, match="nested too deeply to be a recipe"):
        Recipe.from_yaml(path)
    with pytest.raises(RecipeError, match="the value is not valid YAML"):
        Recipe().override(["seed=" + "[" * 1000 + "]" * 1000])


def test_stale_temp_files_of_a_killed_save_are_removed(tmp_path):
    """A resumed run removes what its own saves cut short left, and nothing else: the temp
    file of an `aiayn average` saving into the run directory meanwhile was deleted, and
    that average failed ("cannot write (No such file or directory)")."""
    from aiayn.train.runfolder import remove_stale_temp_files

    path = save_checkpoint(state(1.0), tmp_path / "checkpoint_last.pt")
    names = ["checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_epoch003.pt"]
    names += ["checkpoint_step0000040.pt"]
    stale = [tmp_path / f".{name}.k2x9_q1a.tmp" for name in names]  # saves cut short
    for file in stale:
        file.write_bytes(b"half a checkpoint")
    keep = [tmp_path / "notes.tmp", tmp_path / ".checkpoint_averaged.pt.abc123xy.tmp"]
    for file in keep:
        file.write_text("not the run's")
    remove_stale_temp_files(tmp_path)
    assert not any(f.exists() for f in stale) and all(f.exists() for f in keep)
    assert load_checkpoint(path)["step"] == 1


def test_a_ctrl_c_inside_a_save_is_a_keyboard_interrupt(tmp_path, monkeypatch):
    """torch.save's writer turns a Ctrl-C into its RuntimeError ("enforce fail at
    inline_container.cc"), raised while handling it: that came out, so neither a
    notebook's `except KeyboardInterrupt` nor the command line's "interrupted" saw it."""
    path = save_checkpoint(state(1.0), tmp_path / "checkpoint_last.pt")

    def interrupted(*_args: object, **_kwargs: object) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            # as torch's writer does: raised while handling the Ctrl-C (its __context__)
            raise RuntimeError("[enforce fail at inline_container.cc:672]")  # noqa: B904

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(state(2.0), path)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    # A save in a handler of the caller's own Ctrl-C (a notebook saving as it stops) that
    # fails for its own reason raises that reason, not the Ctrl-C it was saved in.
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        with pytest.raises((pickle.PicklingError, AttributeError)):  # as Python words it
            save_checkpoint({**state(2.0), "unpicklable": lambda: 0}, path)


def test_a_checkpoint_with_the_old_norm_names_loads_as_a_model(sample_model_dir, tmp_path):
    """Checkpoints written before the sub-layer rename (LayerNorms under attn_block /
    self_block / cross_block / ffn_block) translate exactly as before."""
    from aiayn.checkpoint import load_model, resolve_checkpoint
    from aiayn.translator import Translator

    path = resolve_checkpoint(sample_model_dir(False))
    old = load_checkpoint(path)
    renames = {"self_attn_norm": "self_block.norm", "cross_attn_norm": "cross_block.norm"}
    renames["ffn_norm"] = "ffn_block.norm"
    legacy = {}
    for key, value in old["model"].items():
        for new, was in renames.items():
            if f".{new}." in key:
                was = "attn_block.norm" if key.startswith("encoder.") and new[0] == "s" else was
                key = key.replace(f".{new}.", f".{was}.")
        legacy[key] = value
    assert any("attn_block.norm" in k for k in legacy) and not any("_norm." in k for k in legacy)
    old_path = save_checkpoint({**old, "model": legacy}, tmp_path / "old.pt")
    lines = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    now, before = Translator(*load_model(path)), Translator(*load_model(old_path))
    assert before.translate(lines, beam=2) == now.translate(lines, beam=2)
    # A run resumed across the rename holds both namings: averaging them refused with
    # "no weight 'decoder.layers.0.cross_block.norm.bias' (as ... has)".
    from aiayn.train.averaging import average_checkpoints

    for paths in ([old_path, path], [path, old_path], [old_path, old_path]):
        averaged = average_checkpoints(paths)["model"]
        assert averaged.keys() == old["model"].keys()
        assert all(torch.equal(averaged[k], t) for k, t in old["model"].items())


def test_save_refuses_a_folder_or_a_fifo_and_names_a_path_it_cannot_write(tmp_path):
    folder, fifo, file = tmp_path / "adir", tmp_path / "fifo", tmp_path / "file"
    folder.mkdir()
    os.mkfifo(fifo)
    file.write_text("kept")
    with pytest.raises(CheckpointError, match=r"adir: is a directory"):
        save_checkpoint(state(1.0), folder)
    with pytest.raises(CheckpointError, match=r"fifo: not a regular file"):
        save_checkpoint(state(1.0), fifo)
    with pytest.raises(CheckpointError, match=r"file/c\.pt: cannot write \("):
        save_checkpoint(state(1.0), file / "c.pt")
    assert folder.is_dir() and not any(folder.iterdir()) and stat.S_ISFIFO(fifo.stat().st_mode)
    assert file.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "fifo", "file"]  # no temp


DAMAGES = {  # what is broken -> the message that names it
    "config str": (
        {"config": "hello"},
        r"c\.pt: checkpoint entry 'config' is malformed \(a str, not a mapping",
    ),
    "model int": ({"model": 5}, r"c\.pt: checkpoint entry 'model' is malformed \(an int, not"),
    "weight str": ({"model": {"w": "x"}}, r"malformed \('w' is a str, not a tensor\)"),
    "vocab str": (
        {"config": {"src_vocab_size": "abc", "tgt_vocab_size": 10}},
        r"c\.pt: TransformerConfig\.src_vocab_size: must be an int, got 'abc'",
    ),
    "max_len str": (
        {"config": {"src_vocab_size": 10, "tgt_vocab_size": 10, "max_len": "x"}},
        r"c\.pt: TransformerConfig\.max_len: must be an int, got 'x'",
    ),
    "n_heads": (
        {"config": {"src_vocab_size": 10, "tgt_vocab_size": 10, "n_heads": 7}},
        r"c\.pt: TransformerConfig\.n_heads: d_model=512 is not divisible by n_heads=7",
    ),
    "unknown field": (
        {"config": {"src_vocab_size": 10, "tgt_vocab_size": 10, "wibble": 3}},
        r"c\.pt: TransformerConfig: unknown field\(s\) wibble",
    ),
    "tokenizer garbage": (
        {"tokenizer": b"garbage"},
        r"c\.pt: checkpoint entry 'tokenizer': not a valid SentencePiece model",
    ),
    "tokenizer str": ({"tokenizer": "spm"}, r"'tokenizer' is malformed \(a str, not bytes\)"),
    "nan": ({"model": {"w": torch.tensor([1.0, float("nan")])}}, r"c\.pt: weight 'w' holds NaN"),
    "inf": ({"model": {"w": torch.tensor([-float("inf")])}}, r"weight 'w' holds NaN or infinity"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_entries_are_named_at_load(tmp_path, damage):
    change, message = DAMAGES[damage]
    path = save_checkpoint({**state(1.0), **change}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_large_finite_weights_whose_sum_overflows_still_load(tmp_path):
    path = save_checkpoint(
        {**state(1.0), "model": {"w": torch.full((4,), 3e38)}}, tmp_path / "c.pt"
    )
    assert load_checkpoint(path)["model"]["w"].sum().isinf()  # the sum overflows, no value does


def test_text_overrides_are_taken_as_given_and_no_checkpoint_name_is_named(tmp_path):
    """``--init-from DIR:`` used to become the YAML mapping {DIR: None}, then the path
    "{'DIR'/ None}"; text fields now keep their text, and ``DIR:`` is named as such."""
    recipe = Recipe().override(["init_from=/m:", "train_src=1e3", "valid_src=a: b", "warmup=40"])
    assert (recipe.init_from, recipe.train_src, recipe.valid_src) == ("/m:", "1e3", "a: b")
    assert recipe.warmup == 40
    with pytest.raises(CheckpointError, match=r"'/m:' names no checkpoint after ':'"):
        split_model_spec(recipe.init_from)
    path = tmp_path / "r.yaml"
    path.write_text("init_from:\n  /m: null\n")
    wrong = r"field 'init_from' must be a string, got \{'/m': None\}"
    with pytest.raises(RecipeError, match=wrong):
        Recipe.from_yaml(path)


def test_a_checkpoint_file_name_is_looked_up_in_the_model_directory(tmp_path, monkeypatch):
    from aiayn.checkpoint import resolve_checkpoint

    model_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    model_dir.mkdir()
    elsewhere.mkdir()
    (model_dir / "checkpoint_epoch003.pt").write_bytes(b"x")
    monkeypatch.chdir(elsewhere)
    name = "checkpoint_epoch003.pt"
    assert resolve_checkpoint(model_dir, name) == model_dir / name  # not in the cwd
    (elsewhere / name).write_bytes(b"y")
    assert resolve_checkpoint(model_dir, name) == Path(name)  # a file here is what it names
    absolute = str(tmp_path / "nowhere.pt")
    assert resolve_checkpoint(model_dir, absolute) == Path(absolute)  # not found: load says so


def test_auto_passes_over_an_average_made_before_training_went_on(
    sample_model_dir, tmp_path, capsys
):
    """After `average` then a resumed run, `--checkpoint auto` kept decoding the old
    average without a word: it now takes the best (or last) checkpoint and says why."""
    from aiayn.checkpoint import AVERAGED, BEST, LAST, resolve_checkpoint, stale_average
    from aiayn.cli import main

    run = tmp_path / "run"
    run.mkdir()
    state = load_checkpoint(sample_model_dir() / BEST)
    for name, step in ((BEST, 40), (LAST, 50)):
        save_checkpoint({**state, "step": step}, run / name)
    # Made when training was at step 30, of checkpoints up to step 20.
    save_checkpoint({**state, "step": 20, "run_step": 30}, run / AVERAGED)
    assert stale_average(run) == (30, 50)
    assert resolve_checkpoint(run) == run / BEST
    assert resolve_checkpoint(run, "averaged") == run / AVERAGED  # asked for by name: taken
    assert main(["summary", "--model", str(run)]) == 0
    assert f"{run}/{AVERAGED} was made at step 30, before its {LAST} (step 50)" in (
        capsys.readouterr().err
    )
    # export takes the best checkpoint too, and now says so as the others do (it did not)
    assert main(["export", "marian", "--model", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert f"{run}/{AVERAGED} was made at step 30" in capsys.readouterr().err
    # Averaged again once training stopped at step 50, of the newest epoch checkpoint (at
    # step 40, since a killed run saves checkpoint_last.pt after it): current.
    save_checkpoint({**state, "step": 40, "run_step": 50}, run / AVERAGED)
    assert stale_average(run) is None and resolve_checkpoint(run) == run / AVERAGED
    assert main(["summary", "--model", str(run)]) == 0
    assert "predates" not in capsys.readouterr().err
    save_checkpoint({**state, "step": 45}, run / "checkpoint_epoch001.pt")
    assert main(["average", "--model", str(run), "--last", "1"]) == 0  # records run_step 50
    assert load_checkpoint(run / AVERAGED)["run_step"] == 50 and stale_average(run) is None
    (run / LAST).unlink()  # an imported or averaged-only directory: nothing to compare
    assert stale_average(run) is None and resolve_checkpoint(run) == run / AVERAGED
    # An older aiayn's average records no run_step, so nobody can tell whether training
    # went on (a killed run's checkpoint_last.pt is newer than its newest epoch checkpoint).
    # auto still takes it, and a note says so where a newer epoch checkpoint shows that
    # training went on (it was taken without a word).
    save_checkpoint({**state, "step": 50}, run / LAST)
    save_checkpoint({**state, "step": 45}, run / AVERAGED)  # of checkpoint_epoch001.pt
    assert stale_average(run) is None and resolve_checkpoint(run) == run / AVERAGED
    assert main(["summary", "--model", str(run)]) == 0
    assert "note:" not in capsys.readouterr().err  # last is newer, no epoch checkpoint is
    save_checkpoint({**state, "step": 48}, run / "checkpoint_epoch002.pt")
    assert resolve_checkpoint(run) == run / AVERAGED
    assert main(["summary", "--model", str(run)]) == 0
    assert (
        f"{run}/{AVERAGED} was made by an older aiayn, which did not record how far training "
        "had gone, and checkpoint_epoch002.pt is newer than every checkpoint it averages"
    ) in capsys.readouterr().err


def test_average_takes_a_state_saved_twice_once(sample_model_dir, tmp_path, capsys):
    """A time limit that is a multiple of save_every_minutes saves the last update as a
    timed checkpoint and as the epoch's: `average --last 3` took both, so it averaged two
    states and counted the last twice."""
    import time

    from aiayn.checkpoint import AVERAGED, BEST
    from aiayn.cli import main

    run = tmp_path / "run"
    run.mkdir()
    state = load_checkpoint(sample_model_dir() / BEST)
    weights = state["model"]
    names = ["checkpoint_step0000010.pt", "checkpoint_step0000020.pt", "checkpoint_step0000030.pt"]
    saves = [(names[0], 10), (names[1], 20), (names[2], 30), ("checkpoint_epoch001.pt", 30)]
    for i, (name, step) in enumerate(saves):  # oldest first, by the time written
        model = {k: t + i if t.is_floating_point() else t for k, t in weights.items()}
        save_checkpoint({**state, "model": model, "step": step}, run / name)
        time.sleep(0.01)
    assert main(["average", "--model", str(run), "--last", "3"]) == 0
    out, err = capsys.readouterr()
    assert "note: checkpoint_step0000030.pt is step 30, as checkpoint_epoch001.pt" in err
    assert "checkpoint_step0000020.pt, checkpoint_epoch001.pt ->" in out
    averaged = load_checkpoint(run / AVERAGED)
    assert averaged["averaged_from"] == [str(run / n) for n in (names[0], names[1])] + [
        str(run / "checkpoint_epoch001.pt")
    ]
    key = next(k for k, t in weights.items() if t.is_floating_point())
    torch.testing.assert_close(averaged["model"][key], weights[key] + (0 + 1 + 3) / 3)


def test_a_checkpoint_has_the_umasks_permissions_or_those_of_the_file_it_replaces(tmp_path):
    """Saved through mkstemp, every checkpoint (and `aiayn average`'s) was private (0600)
    whatever the umask: a model directory shared with a group or a service could not be
    read. Now a new one gets what the umask gives, and a replaced one keeps its mode."""
    path = tmp_path / "c.pt"
    save_checkpoint({"x": 1}, path)
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    path.chmod(0o640)
    save_checkpoint({"x": 2}, path)
    assert path.stat().st_mode & 0o777 == 0o640
    assert torch.load(path, weights_only=True)["x"] == 2


def test_a_whole_file_of_other_python_objects_is_not_called_corrupt(tmp_path):
    """torch.save of a whole module, or a checkpoint with a numpy scalar in it, was "the
    file is truncated or corrupt (UnpicklingError)": intact, they hold Python objects that
    the weights-only loader refuses (and that are never unpickled). Damage is still named
    damage, even where the damaged bytes name such an object."""
    import numpy as np

    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    torch.save(
        {**state(1.0), "format": "aiayn-checkpoint-1", "bleu": np.float64(30.1)}, tmp_path / "np.pt"
    )
    for name, held in (("module.pt", r"torch\.nn\.modules\.linear\.Linear"), ("np.pt", "numpy")):
        with pytest.raises(
            CheckpointError,
            match=rf"{name}: not an aiayn checkpoint: it holds Python objects other than "
            rf"tensors \({held}",
        ):
            load_checkpoint(tmp_path / name)
    data = bytearray((tmp_path / "np.pt").read_bytes())
    data[data.index(b"scalar")] = ord("S")  # another global, in a pickle whose CRC is wrong
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=r"bad\.pt: cannot read checkpoint, the file is trunc"
    ):
        load_checkpoint(tmp_path / "bad.pt")


def test_integer_weights_where_the_model_has_floats_are_refused(sample_model_dir, tmp_path):
    """Cast by load_state_dict without a word, they translated garbage with exit 0."""
    from aiayn.checkpoint import BEST, load_inference, load_model

    sound = load_checkpoint(sample_model_dir() / BEST)
    name = "src_embed.weight"
    for dtype in (torch.int64, torch.bool):
        model = {**sound["model"], name: sound["model"][name].round().to(dtype)}
        path = save_checkpoint({**sound, "model": model}, tmp_path / "int.pt")
        kind = str(dtype).removeprefix("torch.")
        with pytest.raises(CheckpointError, match=rf"int\.pt: weight '{name}' holds {kind} val"):
            load_model(path)
    # A sound checkpoint still loads, quantized (int8 weights made after loading) too.
    assert load_inference(sample_model_dir() / BEST, quantize=True)[0] is not None
